"""The mark every table and plot puts on a speedup that was not timed alone, on one environment.

A speedup is flagged when any of its questions, on the method's side or AR's, was timed while other
processes loaded the device (run/contention.py), when either side was timed without the timing lock
(`timing.exclusive=false`), or when the method and its AR answers were timed on different hardware or
software (run/provenance.py). Answers written before timing was recorded carry no flag.
"""

from __future__ import annotations

MARK = "†"


def timing_flags(records: list[dict], baseline: list[dict]) -> list[str]:
    """Why a run's speedups are not to be trusted as they are (empty: nothing found)."""
    ids = {r["question_id"] for r in records}
    base = [b for b in baseline if b["question_id"] in ids]
    timings = [(r.get("timing") or {}) for r in records]
    base_timings = [(b.get("timing") or {}) for b in base]
    flags = []
    method_n = sum(1 for t in timings if t.get("contended"))
    ar_n = sum(1 for t in base_timings if t.get("contended"))
    if method_n or ar_n:
        flags.append(f"{method_n + ar_n} timed question(s) under other load (method {method_n}, AR {ar_n})")
    if any(t.get("exclusive") is False for t in timings + base_timings):
        flags.append("timed on a shared device (timing.exclusive=false)")
    envs = {t["environment"] for t in timings if t.get("environment")}
    base_envs = {t["environment"] for t in base_timings if t.get("environment")}
    if len(envs | base_envs) > 1:
        flags.append("method and AR timed on different hardware or software")
    return flags


def summary_flags(summary: dict) -> list[str]:
    """The flags of a run timed in one process (a serving run: each side one timed section), from its
    summary's `timing`."""
    timing = summary.get("timing") or {}
    flags = []
    n = (timing.get("contended") or 0) + (timing.get("baseline_contended") or 0)
    if n:
        flags.append(f"{n} timed side(s) under other load")
    if timing.get("exclusive") is False:
        flags.append("timed on a shared device (timing.exclusive=false)")
    return flags


def merged(flag_lists: list[list[str]]) -> list[str]:
    """Repeated runs' flags as one list (each reason once, in first-seen order)."""
    out: list[str] = []
    for flags in flag_lists:
        out += [f for f in flags or [] if f not in out]
    return out


def marked(label: str, flags: list[str] | None) -> str:
    return f"{label} {MARK}" if flags else label


def footnote(rows: list[dict], label_of) -> str | None:
    """The table's footnote for its marked rows (None: none is marked)."""
    lines = [f"{label_of(r)}: {'; '.join(r['timing_flags'])}" for r in rows if r.get("timing_flags")]
    if not lines:
        return None
    return f"{MARK} not timed alone on one environment, so not comparable as is: " + " | ".join(lines)

"""The mark every table and plot puts on a speedup that was not timed alone, on one environment.

A speedup is flagged when any of its questions, on the method's side or AR's, was timed while other
processes loaded the device (run/contention.py), when either side was timed without the timing lock
(`timing.exclusive=false`), when the method and its AR answers were timed on different hardware or
software (run/provenance.py), or when the machine itself ran at another speed for the method than for AR: a
plain (one-row) step does AR's step's work in every method, so a method whose plain steps took clearly less
or more than AR's steps at the same contexts was timed on a faster or slower machine than its AR (a shared AR
made hours apart, a CPU that drifts). Answers written before timing was recorded carry no flag.
"""

from __future__ import annotations

from specbench.run.metrics import plain_step_ratio

MARK = "†"
# a method's plain steps under this share of AR's at the same contexts: timed on a faster machine; over
# SLOWER: on a slower one, or its own host work slows its forwards (evicted caches), hence the wider
# margin that way (how far interleaved runs go: docs/protocol.md, "Timing alone")
FASTER, SLOWER = 0.9, 1.15
PLAIN_STEPS = 20  # the fewest plain steps, each against AR's at its context, to tell


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
    drift = drift_line(*plain_step_ratio(records, base))
    if drift:
        flags.append(drift)
    return flags


def drift_line(ratio: float | None, pairs: int) -> str | None:
    """What `plain_step_ratio` says of the machine, when the two sides met different speeds (else None)."""
    if pairs < PLAIN_STEPS or FASTER <= ratio <= SLOWER:
        return None
    return (f"its plain steps took {ratio:.2f}x the time of AR's at the same contexts: the machine ran "
            f"{'faster' if ratio < FASTER else 'slower'} for the method than for AR (compare with AR interleaved, "
            f"or head to head)")


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
    return f"{MARK} not timed alone on one environment, or at another machine speed than its AR, so not comparable as is: " + " | ".join(lines)

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

MARK = "†"
# a method's plain steps under this share of AR's at the same contexts: timed on a faster machine; over
# SLOWER: on a slower one, or its own host work slows its forwards (evicted caches), hence the wider
# margin that way (how far interleaved runs go: docs/protocol.md, "Timing")
FASTER, SLOWER = 0.9, 1.15
PLAIN_STEPS = 20  # the fewest plain steps, each against AR's at its context, to tell


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def plain_steps(records: list[dict]) -> dict[tuple, float]:
    """Every one-row step's milliseconds less the drafter's propose and observe, keyed by (question,
    turn, context: the tokens before it). A one-row step is the same work in every method at the same
    context: what it cost is the machine's speed as the run met it. Turns without step times give none."""
    out = {}
    for r in records:
        for k, t in enumerate(r.get("turns") or []):
            rows, times, accepted = t.get("step_rows"), t.get("step_times"), t.get("accept_lengths")
            if not (rows and times and accepted and "input_tokens" in t):
                continue
            propose = t.get("step_propose_times") or [0.0] * len(times)
            observe = t.get("step_observe_times") or [0.0] * len(times)
            context = t["input_tokens"] + 1  # the prefill emits the first token
            for w, s, p, o, a in zip(rows, times, propose, observe, accepted):
                if w == 1:
                    out[(r["question_id"], k, context)] = 1e3 * (s - p - o)
                context += a
    return out


def plain_step_ratio(records: list[dict], baseline: list[dict]) -> tuple[float | None, int]:
    """(median over the method's one-row steps of their time over AR's step at the same question, turn
    and context; how many such pairs). About 1 where both met the same machine."""
    mine, ar = plain_steps(records), plain_steps(baseline)
    ratios = [ms / ar[key] for key, ms in mine.items() if ar.get(key, 0) > 0]
    return (_median(ratios) if ratios else None), len(ratios)


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
    ratio, pairs = plain_step_ratio(records, base)
    if pairs >= PLAIN_STEPS and not FASTER <= ratio <= SLOWER:
        flags.append(f"its plain steps took {ratio:.2f}x the time of AR's at the same contexts: the machine ran "
                     f"{'faster' if ratio < FASTER else 'slower'} for the method than for AR (compare with AR "
                     f"interleaved, or head to head)")
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

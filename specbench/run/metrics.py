"""Spec-Bench's metric definitions, and acceptance and latency figures, as pure functions over
answer records.

A record is one question's line of answers.jsonl: it has 'subtask' and 'turns', each turn with
new_tokens, wall_time, prefill_time and accept_lengths, and from newer runs step_drafted (draft
tree nodes per step) and step_times (seconds per step), input_tokens (the prompt's length) and the
memory a turn held (kv_cache_bytes, drafter_state_bytes, peak_device_bytes: run/memory.py). Figures
that need the newer fields are None for records without them, so older runs still report
everything else.
"""

from __future__ import annotations

import random
from statistics import mean, median, stdev

from specbench.inputs.questions import SUBTASKS


def ordered_subtasks(names) -> list[str]:
    """Subtask names, each once, in a stable order: Spec-Bench's six in their leaderboard order when
    they are the ones present, else the order of first appearance (task=long's 1k, 2k, 4k, 8k)."""
    present = list(dict.fromkeys(names))
    return [s for s in SUBTASKS if s in present] if set(present) <= set(SUBTASKS) else present


def subtasks(records: list[dict]) -> list[str]:
    """The subtasks of these records, ordered as ordered_subtasks says."""
    return ordered_subtasks(r["subtask"] for r in records)


def question_speed(record: dict, decode_only: bool = False) -> float:
    """New tokens over wall time, summed over the question's turns."""
    tokens = sum(t["new_tokens"] for t in record["turns"])
    time = sum(t["wall_time"] - (t["prefill_time"] if decode_only else 0.0) for t in record["turns"])
    return tokens / time if time > 0 else 0.0


def tokens_per_s(records: list[dict], decode_only: bool = False) -> float:
    """Mean over questions of each question's speed."""
    return mean(question_speed(r, decode_only) for r in records) if records else 0.0


def mat(records: list[dict]) -> float:
    """MAT per step, Spec-Bench's mean accepted tokens: every decoding step's accepted length
    (accepted draft tokens + 1), pooled over all steps of all questions."""
    lengths = [a for r in records for t in r["turns"] for a in t["accept_lengths"]]
    return mean(lengths) if lengths else 0.0


def mat_per_question(records: list[dict]) -> float:
    """MAT per question: the mean over questions of each question's own MAT (its steps pooled over
    its turns), so a long answer weighs as much as a short one; questions without a step are left out."""
    per_q = [mat([r]) for r in records if any(t["accept_lengths"] for t in r["turns"])]
    return mean(per_q) if per_q else 0.0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    v = sorted(values)
    x = (len(v) - 1) * q / 100
    lo = int(x)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (x - lo)


def _percentiles(values: list[float], qs=(50, 90, 99)) -> dict:
    return {f"p{q}": percentile(values, q) for q in qs}


def _every_turn_has(records: list[dict], key: str) -> bool:
    turns = [t for r in records for t in r["turns"]]
    return bool(turns) and all(key in t for t in turns)


def accept_length_histogram(records: list[dict]) -> dict[int, int]:
    """Decoding steps per accepted length L (accepted draft tokens + 1), in increasing L: 1 = the
    step accepted nothing (a plain step, or a draft whose first token was rejected)."""
    counts: dict[int, int] = {}
    for a in (a for r in records for t in r["turns"] for a in t["accept_lengths"]):
        counts[a] = counts.get(a, 0) + 1
    return dict(sorted(counts.items()))


def _drafted_steps(records: list[dict]) -> list[tuple[int, int]] | None:
    """(accepted length, drafted nodes) of every step; None unless every turn records step_drafted."""
    if not _every_turn_has(records, "step_drafted"):
        return None
    return [s for r in records for t in r["turns"] for s in zip(t["accept_lengths"], t["step_drafted"])]


def acceptance_by_depth(records: list[dict]) -> dict | None:
    """Acceptance per draft depth d = 1..the deepest accepted, over the steps that drafted
    (step_drafted > 0): marginal[d-1] = P(depth d accepted) = the share of those steps accepting at
    least d draft tokens; conditional[d-1] = P(d accepted | d-1 accepted) = steps accepting >= d over
    steps accepting >= d-1 (depth 0, the root, is always accepted). A tree shallower than d counts as
    not accepting d. None without step_drafted (older records) or when no step drafted."""
    steps = _drafted_steps(records)
    accepted = [a - 1 for a, n in steps or [] if n > 0]
    if not accepted:
        return None
    reach = [sum(a >= d for a in accepted) for d in range(max(accepted) + 1)]  # reach[0] = all steps
    return {"steps": len(accepted),
            "marginal": [reach[d] / reach[0] for d in range(1, len(reach))],
            "conditional": [reach[d] / reach[d - 1] for d in range(1, len(reach))]}


def drafted_acceptance_rate(records: list[dict]) -> float | None:
    """Accepted draft tokens / drafted tokens, pooled over all steps: sum(accept_length - 1) /
    sum(step_drafted). Drafted tokens are the draft tree's nodes (Lookahead's window rows, never
    accepted, are not drafts). None without step_drafted (older records) or when nothing was drafted."""
    steps = _drafted_steps(records)
    drafted = sum(n for _, n in steps or [])
    return sum(a - 1 for a, _ in steps) / drafted if drafted else None


def ttft(records: list[dict]) -> dict | None:
    """Time to first token of every turn, its prefill (the prompt's forward and the first token's
    choice): mean, p50, p90 and p99 in seconds. None without turns."""
    times = [t["prefill_time"] for r in records for t in r["turns"]]
    return {"mean": mean(times), **_percentiles(times)} if times else None


def per_token_latency(records: list[dict]) -> dict | None:
    """Latency of every token a decoding step emitted: the step's wall time divided by the tokens it
    emitted, one value per emitted token (the first token of a turn is the prefill's: see ttft);
    p50, p90 and p99 in seconds over the run. None without step_times (older records) or steps."""
    if not _every_turn_has(records, "step_times"):
        return None
    per_token = [dt / a for r in records for t in r["turns"]
                 for dt, a in zip(t["step_times"], t["accept_lengths"]) for _ in range(a)]
    return _percentiles(per_token) if per_token else None


def tpot(records: list[dict]) -> float | None:
    """Time per output token after the first, per question: (wall - prefill) / (new tokens - 1),
    each summed over the question's turns (every turn's first token is its prefill's); the mean over
    questions. None when no question has a second token."""
    per_q = []
    for r in records:
        tokens = sum(t["new_tokens"] - 1 for t in r["turns"])
        if tokens > 0:
            per_q.append(sum(t["wall_time"] - t["prefill_time"] for t in r["turns"]) / tokens)
    return mean(per_q) if per_q else None


def speedup(method: list[dict], baseline: list[dict], decode_only: bool = False) -> dict:
    """mean(method speeds) / mean(baseline speeds), overall and per subtask, on the same questions."""
    base_by_id = {r["question_id"]: r for r in baseline}
    pairs = [(r, base_by_id[r["question_id"]]) for r in method if r["question_id"] in base_by_id]

    def ratio(ps):
        if not ps:
            return None
        b = tokens_per_s([p[1] for p in ps], decode_only)
        return tokens_per_s([p[0] for p in ps], decode_only) / b if b > 0 else None

    out = {"overall": ratio(pairs)}
    for sub in subtasks([p[0] for p in pairs]):
        out[sub] = ratio([p for p in pairs if p[0]["subtask"] == sub])
    return out


def question_speeds(method: list[dict], baseline: list[dict]) -> dict:
    """{question id: (method speed, baseline speed)} over the questions both runs answered, in the
    method's order: what a speedup interval resamples."""
    base = {r["question_id"]: question_speed(r) for r in baseline}
    return {r["question_id"]: (question_speed(r), base[r["question_id"]]) for r in method if r["question_id"] in base}


def speedup_ci(method: list[dict], baseline: list[dict], level: float = 0.95, resamples: int = 2000,
               seed: int = 0) -> tuple[float, float] | None:
    """Bootstrap confidence interval of the overall speedup of one run: `repeated_speedup_ci` of it."""
    return repeated_speedup_ci([question_speeds(method, baseline)], level, resamples, seed)


def repeated_speedup_ci(runs: list[dict], level: float = 0.95, resamples: int = 2000,
                        seed: int = 0) -> tuple[float, float] | None:
    """Bootstrap confidence interval of the overall speedup over repeated runs of one method.

    runs: each run's `question_speeds`. The question ids every run shares are resampled with
    replacement (seeded, `resamples` times), a question's runs together, since a question's length and
    repetitiveness decide most of its speedup in every run. A resample's speedup is the mean over
    runs of each run's speedup as `speedup` defines it (mean(method speeds) / mean(baseline speeds)
    over the resampled questions), as a table's repeated row averages its runs. The interval is those
    speedups' (1 - level) / 2 and (1 + level) / 2 percentiles; None with fewer than two shared
    questions."""
    if not runs:
        return None
    ids = [q for q in runs[0] if all(q in run for run in runs[1:])]
    if len(ids) < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        sample = rng.choices(ids, k=len(ids))
        per_run = []
        for run in runs:
            b = sum(run[q][1] for q in sample)
            if b <= 0:
                break
            per_run.append(sum(run[q][0] for q in sample) / b)  # same count on both sides: a ratio of means
        else:
            ratios.append(mean(per_run))
    if not ratios:
        return None
    return percentile(ratios, 50 * (1 - level)), percentile(ratios, 50 * (1 + level))


# Student's t, two-sided 95%: its 0.975 quantile for 1 .. 30 degrees of freedom (beyond: the normal's)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def mean_interval_95(values: list[float]) -> tuple[float, float] | None:
    """95% confidence interval of the mean of independent measurements (Student's t): for a sweep's
    rounds, each its own draw of the machine's drift, whether a speedup's mean is told apart from 1.
    None below two values."""
    n = len(values)
    if n < 2:
        return None
    m = mean(values)
    half = (T975[n - 2] if n - 1 <= len(T975) else 1.960) * stdev(values) / n ** 0.5
    return m - half, m + half


def rows_per_step(records: list[dict]) -> float:
    """Mean rows per verification forward (root + draft rows + extra rows), pooled over steps."""
    rows = [w for r in records for t in r["turns"] for w in t.get("step_rows", [])]
    return mean(rows) if rows else 0.0


def sum_statistics(stats: list[dict | None]) -> dict | None:
    """Drafter statistics of many questions, summed: numbers add, lists of numbers add element by
    element, anything else (a template, a label) must agree and is kept once."""
    stats = [s for s in stats if s]
    if not stats:
        return None
    out = dict(stats[0])
    for s in stats[1:]:
        for k, v in s.items():
            if k not in out:
                out[k] = v
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = out[k] + v
            elif isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
                if len(v) != len(out[k]):
                    raise ValueError(f"statistics '{k}' have lengths {len(out[k])} and {len(v)}: "
                                     f"runs with different trees cannot be summed")
                out[k] = [a + b for a, b in zip(out[k], v)]
            elif out[k] != v:
                raise ValueError(f"statistics '{k}' differ between questions ({out[k]!r} vs {v!r})")
    return out


def prefill_time(records: list[dict]) -> float | None:
    """Mean prefill time of a turn in seconds (the prompt's forward and the first token's choice,
    apart from decoding); None without turns."""
    times = [t["prefill_time"] for r in records for t in r["turns"] if "prefill_time" in t]
    return mean(times) if times else None


def input_tokens(records: list[dict]) -> float | None:
    """Mean prompt length of a turn in tokens (chat template included); None unless every turn
    records input_tokens (older runs do not)."""
    if not _every_turn_has(records, "input_tokens"):
        return None
    return mean(t["input_tokens"] for r in records for t in r["turns"])


MEMORY_KEYS = ("kv_cache_bytes", "drafter_state_bytes", "peak_device_bytes")


def memory_peak(records: list[dict], key: str) -> int | None:
    """The largest `key` (one of MEMORY_KEYS) over the turns that record it; None where none does
    (older runs; peak_device_bytes off CUDA)."""
    values = [t[key] for r in records for t in r["turns"] if t.get(key) is not None]
    return max(values) if values else None


def subtask_figures(records: list[dict], baseline: list[dict]) -> dict:
    """Per subtask, in the order `subtasks` gives: questions, mean input tokens, speedup and decode
    speedup over `baseline` (None without it), MAT, drafted-token acceptance, mean prefill time of
    the method and of the baseline, and the memory peaks (MEMORY_KEYS, the largest turn)."""
    sp = speedup(records, baseline) if baseline else {}
    dsp = speedup(records, baseline, decode_only=True) if baseline else {}
    base_ids = {b["question_id"]: b for b in baseline}
    out = {}
    for sub in subtasks(records):
        recs = [r for r in records if r["subtask"] == sub]
        base = [base_ids[r["question_id"]] for r in recs if r["question_id"] in base_ids]
        out[sub] = {"questions": len(recs), "input_tokens": input_tokens(recs), "speedup": sp.get(sub),
                    "decode_speedup": dsp.get(sub), "mat": mat(recs),
                    "drafted_token_rate": drafted_acceptance_rate(recs), "prefill_time": prefill_time(recs),
                    "baseline_prefill_time": prefill_time(base) if base else None,
                    **{k: memory_peak(recs, k) for k in MEMORY_KEYS}}
    return out


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
    return (median(ratios) if ratios else None), len(ratios)

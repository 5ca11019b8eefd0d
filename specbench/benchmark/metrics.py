"""Spec-Bench's metric definitions, as pure functions over answer records.

A record is one question's line of answers.jsonl: it has 'subtask' and 'turns', each turn with
new_tokens, wall_time, prefill_time and accept_lengths.
"""

from __future__ import annotations

from statistics import mean

from specbench.inputs.tasks import SUBTASKS


def question_speed(record: dict, decode_only: bool = False) -> float:
    """New tokens over wall time, summed over the question's turns."""
    tokens = sum(t["new_tokens"] for t in record["turns"])
    time = sum(t["wall_time"] - (t["prefill_time"] if decode_only else 0.0) for t in record["turns"])
    return tokens / time if time > 0 else 0.0


def tokens_per_s(records: list[dict], decode_only: bool = False) -> float:
    """Mean over questions of each question's speed."""
    return mean(question_speed(r, decode_only) for r in records) if records else 0.0


def mat(records: list[dict]) -> float:
    """Mean accepted tokens: every decoding step's accepted length, pooled."""
    lengths = [a for r in records for t in r["turns"] for a in t["accept_lengths"]]
    return mean(lengths) if lengths else 0.0


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
    for sub in SUBTASKS:
        sel = [p for p in pairs if p[0]["subtask"] == sub]
        if sel:
            out[sub] = ratio(sel)
    for sub in sorted({p[0]["subtask"] for p in pairs} - set(SUBTASKS)):
        out[sub] = ratio([p for p in pairs if p[0]["subtask"] == sub])
    return out


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

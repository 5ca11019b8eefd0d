"""A single run's summary: every figure of docs/protocol.md computed from the answers (run/metrics.py),
the lossless tally, the bound from the cost curve, and the conditions the run was timed under."""

from __future__ import annotations

import platform
import time

import torch

from specbench.config import RunPlan
from specbench.run import lossless, metrics
from specbench.speculation import cost, roofline


def summarize(plan: RunPlan, records: list[dict], base: list[dict], checks: list[dict],
              curve: cost.CostCurve | None = None, lossless_method: bool = True,
              questions: int | None = None) -> dict:
    """`questions`: how many the run asked (the lossless verdict's denominator; default: the records)."""
    cfg = plan.settings
    ids = {r["question_id"] for r in records}
    base = [b for b in base if b["question_id"] in ids]
    return {
        "method": plan.method, "method_params": cfg.method_settings,
        "lossless_method": lossless_method,  # false: lossy by design, outside the lossless tally
        "model": cfg.model.name, "task": cfg.task.name, "temperature": cfg.temperature,
        "top_k": cfg.top_k, "top_p": cfg.top_p,
        "dtype": cfg.dtype, "device": plan.device_name, "max_new_tokens": cfg.max_new_tokens,
        **speed_figures(records, base), "baseline": cfg.baseline,
        **acceptance_figures(records, base),
        **lossless_figures(records, checks, len(records) if questions is None else questions),
        "drafter_stats": metrics.sum_statistics([r.get("drafter_stats") for r in records]),
        "drafter_host_ms": drafter_host_ms(records),
        "step_split_ms": step_split_ms(records), "baseline_step_split_ms": step_split_ms(base),
        **bound_figures(curve, records),
        "warmup": cfg.warmup, "warmup_on": cfg.warmup_on,
        "forward": plan.forward, "host_memory": cfg.host_memory,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def speed_figures(records: list[dict], base: list[dict]) -> dict:
    """Tokens, time, speed and speedup (Spec-Bench's definitions: run/metrics.py, docs/protocol.md)."""
    ci = metrics.speedup_ci(records, base) if base else None
    return {
        "questions": len(records),
        "new_tokens": sum(t["new_tokens"] for r in records for t in r["turns"]),
        "wall_time": sum(t["wall_time"] for r in records for t in r["turns"]),
        "tokens_per_s": metrics.tokens_per_s(records),
        "decode_tokens_per_s": metrics.tokens_per_s(records, decode_only=True),
        "mat": metrics.mat(records),
        "rows_per_step": metrics.rows_per_step(records),
        "subtasks": metrics.subtasks(records),  # the order of every per-subtask figure (metrics.ordered_subtasks)
        "subtask_mat": {s: metrics.mat([r for r in records if r["subtask"] == s]) for s in metrics.subtasks(records)},
        "baseline_tokens_per_s": metrics.tokens_per_s(base) if base else None,
        "speedup": metrics.speedup(records, base) if base else None,
        "speedup_ci": list(ci) if ci else None,  # 95%, bootstrap over questions
        "decode_speedup": metrics.speedup(records, base, decode_only=True) if base else None,
    }


def acceptance_figures(records: list[dict], base: list[dict]) -> dict:
    return {
        "acceptance": {
            "histogram": metrics.accept_length_histogram(records),
            "drafted_token_rate": metrics.drafted_acceptance_rate(records),
            "by_depth": metrics.acceptance_by_depth(records),
            "mat_per_step": metrics.mat(records), "mat_per_question": metrics.mat_per_question(records),
        },
        "latency": {"ttft": metrics.ttft(records), "per_token": metrics.per_token_latency(records),
                    "tpot_per_question": metrics.tpot(records)},
        # per subtask: input tokens, speedups, MAT, acceptance, prefill time apart from decode, memory peaks
        "by_subtask": metrics.subtask_figures(records, base),
        # the largest turn's, over the run (run/memory.py; None where no turn recorded it)
        "memory": {k: metrics.memory_peak(records, k) for k in metrics.MEMORY_KEYS},
    }


def bound_figures(curve: cost.CostCurve | None, records: list[dict]) -> dict:
    """The speedup with zero harness overhead on this hardware (speculation/cost.py): against
    decode_speedup, the gap is what drafting, verification and bookkeeping cost."""
    bound = cost.run_bound(curve, records)
    # the prediction: the same with the drafter's measured host time in each step (docs/cost-model.md)
    predicted = cost.run_bound(curve, records, drafter_host=True)
    return {"speedup_bound": bound["bound"] if bound else None, "speedup_bound_detail": bound,
            "speedup_predicted": predicted["bound"] if predicted and "drafter_host_ms" in predicted else None,
            "forward_vs_floor": roofline.forward_vs_floor(curve, bound and bound["mean_rows"])}


def lossless_figures(records: list[dict], checks: list[dict], questions: int) -> dict:
    return {
        "lossless": lossless.tally(checks, questions),
        "lossless_details": [dict(r["lossless"], question_id=r["question_id"]) for r in records
                             if r.get("lossless", {}).get("status", "exact") not in ("exact", "unchecked")
                             or r.get("lossless", {}).get("tokens", {}).get("tokens_outside_band")],
    }


def drafter_host_ms(records: list[dict]) -> dict | None:
    """The drafter's mean host milliseconds per step, `propose` and `observe` apart (None: not measured)."""
    out = {}
    for name in ("propose", "observe"):
        times = [s for r in records for t in r["turns"] for s in t.get(f"step_{name}_times") or []]
        if times:
            out[name] = round(1000 * sum(times) / len(times), 4)
    return out or None


def step_split_ms(records: list[dict]) -> dict | None:
    """Mean milliseconds per decoding step in each of the step's phases (decoding/step.py PHASES: the
    drafter's propose, the host's work before the forward, the forward's launch or graph replay,
    verification, the wait for the device's one read, the drafter's observe), over every turn that
    recorded them; None where none did."""
    turns = [t for r in records for t in r["turns"] if t.get("phase_seconds") and t.get("decoding_steps")]
    steps = sum(t["decoding_steps"] for t in turns)
    if not steps:
        return None
    phases = list(dict.fromkeys(k for t in turns for k in t["phase_seconds"]))
    return {k: round(1000 * sum(t["phase_seconds"].get(k, 0.0) for t in turns) / steps, 4) for k in phases}

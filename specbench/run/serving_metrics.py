"""Serving metrics of a batched decode (decoding/batched.py's BatchResult): throughput, latency, TPOT.

Definitions (docs/batched-serving.md): throughput is new tokens of every request over the run's wall
time (arrivals, admission prefills and idle waits included); a request's latency is finish - arrival;
time per output token (TPOT) is (finish - first token) / (tokens - 1), averaged over requests with
more than one token; MAT is emitted tokens per decoding step, pooled over requests.
"""

from __future__ import annotations

import random
import statistics

from specbench.run.metrics import percentile


def poisson_arrivals(n: int, rate: float | None, seed: int) -> list[float]:
    """n arrival times (seconds): the first at 0, then exponential gaps of mean 1/rate (seeded);
    rate None: all at 0 (a closed batch)."""
    if rate is None:
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def serving_figures(result) -> dict:
    """Throughput, latency (mean, p50, p99), TPOT, MAT and rows of one BatchResult."""
    records = result.records
    tokens = sum(len(r.tokens) for r in records)
    latency = [r.finished - r.arrival for r in records]
    tpot = [(r.finished - r.first_token) / (len(r.tokens) - 1) for r in records if len(r.tokens) > 1]
    steps = sum(len(r.accept_lengths) for r in records)
    return {"tokens": tokens, "wall_s": round(result.wall_time, 3),
            "throughput": round(tokens / result.wall_time, 2),
            "latency_mean": round(statistics.mean(latency), 3), "latency_p50": round(percentile(latency, 50), 3),
            "latency_p99": round(percentile(latency, 99), 3),
            "tpot_ms": round(1000 * statistics.mean(tpot), 2) if tpot else None,
            "mat": round(sum(sum(r.accept_lengths) for r in records) / max(steps, 1), 3),
            "rows_per_step": round(statistics.mean(s.rows for s in result.steps), 1) if result.steps else 0.0,
            "batch_steps": len(result.steps), "requests": len(records)}

"""A figure repeated over a handful of rounds: its mean, range and 95% t-interval of the mean."""

from __future__ import annotations

import statistics

# Student's t at 97.5% for n - 1 degrees of freedom: a 95% interval over a handful of rounds
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def round_stats(values: list[float]) -> dict | None:
    """n, mean, min, max and a 95% t-interval of the mean (`interval`, only from two rounds on: one
    gives none); None for no values."""
    if not values:
        return None
    n, mean = len(values), statistics.fmean(values)
    out = {"n": n, "mean": round(mean, 4), "min": round(min(values), 4), "max": round(max(values), 4)}
    if n > 1:
        half = T_975.get(n - 1, 1.96) * statistics.stdev(values) / n ** 0.5
        out["interval"] = [round(mean - half, 4), round(mean + half, 4)]
    return out

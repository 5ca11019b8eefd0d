"""Rows priced from the run's own steps: how much more (or less) than the cost curve says a forward of
w rows costs, learnt from the forwards the run actually times.

A curve is measured once, before the run, on chains of random tokens. On a CPU its shape can move by a
tenth or more from one measurement to the next, and the steps a run times can cost more per row than
it says (docs/token-recycling.md, "Rows priced from the run's own steps"). A chooser that buys rows at
the curve's price then verifies rows that do not pay. `RowCostCorrection` keeps, for each width, the
decayed mean of measured time over the curve's time at that step's context, and turns it into a
factor per width relative to one row's: the curve's shape corrected, its level left alone (a
chooser compares a tree's rate with a plain step's, so only the shape matters).
"""

from __future__ import annotations

import numpy as np

HALF_LIFE = 200  # steps after which a measured step counts half (a few questions' worth of steps)
PRIOR_STEPS = 4.0  # each width starts as this many steps measured at exactly the curve's time
EVIDENCE = 0.5  # a width with at least this much (decayed) weight of its own is read, not interpolated
REFRESH = 16  # steps between two updates of the factors a chooser prices with


class RowCostCorrection:
    """Per width w = 1..rows: measured forward time over the curve's, learnt step by step.

    `factors()` is c(w) / c(1) for every width, where c(w) is the decayed mean ratio at w pulled
    towards 1 by `prior_steps`. Widths with too little evidence of their own take the ratio
    interpolated between the nearest measured widths (held flat beyond the widest), so a width never
    verified is priced like its measured neighbours, not at the curve's bare guess."""

    def __init__(self, rows: int, half_life: float = HALF_LIFE, prior_steps: float = PRIOR_STEPS):
        if rows < 1 or half_life <= 0 or prior_steps < 0:
            raise ValueError(f"rows >= 1, half_life > 0 and prior_steps >= 0 needed, got {rows}, {half_life}, "
                             f"{prior_steps}")
        self.rows, self.prior_steps = rows, prior_steps
        self._decay = 0.5 ** (1.0 / half_life)
        self._ratio_sum = np.zeros(rows)
        self._weight = np.zeros(rows)
        self.steps = 0

    def add(self, rows: int, measured: float, predicted: float) -> None:
        """One step of `rows` rows took `measured` seconds where the curve said `predicted`."""
        if not (measured > 0 and predicted > 0):
            return  # a clock that did not run (or a curve without this width): nothing learnt
        w = min(max(int(rows), 1), self.rows) - 1
        self._ratio_sum *= self._decay
        self._weight *= self._decay
        self._ratio_sum[w] += measured / predicted
        self._weight[w] += 1.0
        self.steps += 1

    def ratios(self) -> np.ndarray:
        """c(w) for every width: measured over predicted, the prior (1) where little was measured."""
        seen = np.flatnonzero(self._weight >= EVIDENCE)
        if seen.size == 0:
            return np.ones(self.rows)
        c = (self.prior_steps + self._ratio_sum[seen]) / (self.prior_steps + self._weight[seen])
        # np.interp holds the end values flat beyond the measured widths
        return np.interp(np.arange(self.rows), seen, c)

    def factors(self) -> list[float]:
        """c(w) / c(1) for w = 1..rows: what each width's time on the curve is multiplied by."""
        c = self.ratios()
        return (c / c[0]).tolist()

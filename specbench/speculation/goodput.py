"""Goodput-aware draft trees: which sub-tree of a template to verify, given what each node is worth
and what each forward width costs on this hardware.

A node's worth p(v) is the probability that it lies on the accepted path, so verifying a
parent-closed set S emits 1 + sum_{v in S} p(v) tokens on average for t(|S| + 1); with p
non-increasing down every path the best step is argmax over m of (1 + prefix_sum_m(p)) / t(m + 1),
m = 0 being the plain step. Estimates come from counterfactual outcomes: `AcceptanceStats` per
template slot, or `RateTable` + `path_probabilities`. Pure (lists and floats; the rate tables' counts in
numpy arrays), so it is tested directly. Derivation and estimators: docs/token-recycling.md, "Hardware-aware speculation".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specbench.errors import SettingsError

# `RateTable.counts` of a table without pools: no pool of any cell, no pool counts
NO_POOLS = (torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.float64))
NO_POOL_PRIOR = torch.empty(0, dtype=torch.float64)  # `RateTable.terms` of a table without pools


def monotone_down(p: Sequence[float], parents: Sequence[int]) -> list[float]:
    """p with every node capped by its parent's value (p[i] is node i + 1; parents[i] its parent,
    0 = root). Parents precede children, so one forward pass suffices."""
    out = list(p)
    for i, par in enumerate(parents):
        if par and out[i] > out[par - 1]:
            out[i] = out[par - 1]
    return out


def best_size(sorted_p: Sequence[float], step_times: Sequence[float], min_gain: float = 0.0) -> int:
    """How many of the best nodes to draft: argmax_m (1 + sum(sorted_p[:m])) / step_times[m].

    `sorted_p` is in decreasing order; `step_times[w - 1]` is the forward time of w rows, for
    w = 1 .. len(sorted_p) + 1 at least. A draft (m > 0) is taken only when its expected tokens per
    second beat the plain step's by the factor 1 + min_gain, a margin for the per-step work the
    curve does not see (tree verification, KV compaction, the drafter's own update). Ties go to the
    smaller m."""
    n = len(sorted_p)
    if len(step_times) < n + 1:
        raise ValueError(f"need forward times for 1..{n + 1} rows, got {len(step_times)}")
    if n == 0:
        return 0
    # 1 + p_1 + ... + p_m summed left to right, as one running total would
    expected = np.cumsum(np.concatenate(([1.0], np.asarray(sorted_p, dtype=np.float64))))[1:]
    rate = expected / np.asarray(step_times[1 : n + 1], dtype=np.float64)
    m = int(np.argmax(rate))  # the first of equal maxima
    return m + 1 if rate[m] > (1.0 / step_times[0]) * (1.0 + min_gain) else 0


def choose_nodes(p: Sequence[float], parents: Sequence[int], step_times: Sequence[float],
                 min_gain: float = 0.0, max_nodes: int | None = None) -> tuple[int, ...]:
    """The node ids (1-based, ascending) of the sub-tree with the best expected tokens per second,
    `max_nodes` at most.

    Empty means a plain step. p is made monotone first, so the chosen set is parent-closed."""
    q = np.asarray(monotone_down(p, parents), dtype=np.float64)
    order = np.argsort(-q, kind="stable")[:max_nodes]  # decreasing; ties by id
    m = best_size(q[order], step_times, min_gain)
    return tuple(sorted((order[:m] + 1).tolist()))


def subtree_parents(nodes: Sequence[int], parents: Sequence[int]) -> tuple[int, ...]:
    """Parents of a parent-closed node set, renumbered 1..len(nodes) in the order given (ascending
    ids keep parents first)."""
    new_id = {0: 0}
    out = []
    for j, v in enumerate(nodes, start=1):
        par = parents[v - 1]
        if par not in new_id:
            raise ValueError(f"node {v}'s parent {par} is not in the chosen set; the set must be parent-closed")
        out.append(new_id[par])
        new_id[v] = j
    return tuple(out)


def counterfactual_path(children: Sequence[Sequence[int]], node_tokens: Sequence[int],
                        continuation: Sequence[int]) -> list[int]:
    """The template nodes that would have been accepted had the whole template been drafted.

    `node_tokens[v]` is the token at node v (0 = root), `children[v]` its children in order,
    `continuation` the tokens decided after the root. Follows the verifier's rule: at each node
    the first child whose token is the next decided token is accepted."""
    path: list[int] = []
    node = 0
    for tok in continuation:
        for child in children[node]:
            if node_tokens[child] == tok:
                path.append(child)
                node = child
                break
        else:
            break
    return path


def prior_probabilities(depths: Sequence[int], ranks: Sequence[int], per_depth: float = 0.5) -> list[float]:
    """A weak prior for each draft node: per_depth ** depth / (1 + rank). Deeper nodes need every
    ancestor accepted, and later siblings are lower-ranked recycled candidates."""
    return [per_depth ** d / (1 + r) for d, r in zip(depths, ranks)]


def check_decay(half_life: float, prior_steps: float) -> None:
    """The statistics' decay settings (tr_adaptive's method.half_life and method.prior_steps)."""
    if half_life <= 0 or prior_steps < 0:
        raise SettingsError(f"need method.half_life > 0 and method.prior_steps >= 0, got {half_life} and "
                            f"{prior_steps}")


class AcceptanceStats:
    """Exponentially decayed counts of how often each template node was on the (counterfactual)
    accepted path, per context bucket, shrunk towards a prior worth `prior_steps` steps.

    p(v) = (hits(v) + prior_steps * prior(v)) / (steps + prior_steps), where hits and steps decay
    by half every `half_life` steps of their bucket so the estimate follows the text (code vs prose)
    and the drafter's matrix as it fills. Decay uses a growing weight instead of rescaling every
    count at every step; weights are renormalised before they overflow.
    """

    def __init__(self, prior: Sequence[float], prior_steps: float = 8.0, half_life: float = 200.0,
                 buckets: int = 1):
        check_decay(half_life, prior_steps)
        if buckets < 1:
            raise ValueError(f"need buckets >= 1, got {buckets}")
        self.prior = list(prior)
        self.prior_steps = float(prior_steps)
        self.growth = 2.0 ** (1.0 / half_life)
        n = len(self.prior)
        self.hits = [[0.0] * n for _ in range(buckets)]
        self.steps = [0.0] * buckets
        self.weight = [1.0] * buckets  # the weight of the next observation (grows by `growth`)
        self.version = [0] * buckets  # bumped at every update: lets callers cache derived choices

    def add(self, path: Sequence[int], bucket: int = 0) -> None:
        """One step's counterfactual accepted path (node ids, 1-based) in `bucket`."""
        w = self.weight[bucket]
        hits = self.hits[bucket]
        for v in path:
            hits[v - 1] += w
        self.steps[bucket] += w
        w *= self.growth
        if w > 1e100:  # renormalise: every count and the weight scale together
            hits[:] = [h / w for h in hits]
            self.steps[bucket] /= w
            w = 1.0
        self.weight[bucket] = w
        self.version[bucket] += 1

    def probabilities(self, bucket: int = 0) -> list[float]:
        """Posterior mean of p(v) for every node, in node order."""
        w = self.weight[bucket]
        prior_mass = self.prior_steps * w / self.growth  # prior worth prior_steps current steps
        denom = self.steps[bucket] + prior_mass
        if denom <= 0:
            return list(self.prior)
        return [(h + prior_mass * p0) / denom for h, p0 in zip(self.hits[bucket], self.prior)]


def path_probabilities(parents: Sequence[int], step_rates: Sequence[float]) -> list[float]:
    """p(v) = p(parent) x q(v) for every node (p of the root = 1), where q(v) is the probability that
    v is accepted given its parent is: non-increasing down every path by construction."""
    p = [1.0]
    for par, q in zip(parents, step_rates):
        p.append(p[par] * q)
    return p[1:]


class RateTable:
    """Exponentially decayed success rates per cell, shrunk towards a prior rate per cell worth
    `prior_steps` trials: q(c) = (hits(c) + prior_steps * prior(c)) / (trials(c) + prior_steps).

    A cell is a class of nodes (e.g. the stored confidence of its matrix entry, its rank, the
    context bucket); a trial is a step in which the node's parent was on the accepted path. Counts
    decay by half every `half_life` calls of `next_step`. The counts are numpy arrays: a drafter adds a
    step's trials at once (`add_many`) and reads every rate at once (`rate_array`), each the same double
    that one cell at a time would give."""

    def __init__(self, prior: Sequence[float], prior_steps: float = 4.0, half_life: float = 400.0):
        check_decay(half_life, prior_steps)
        self.prior = list(prior)
        self._prior = np.array(self.prior, dtype=np.float64)
        self.prior_steps = float(prior_steps)
        self.growth = 2.0 ** (1.0 / half_life)
        self.hits = np.zeros(len(self.prior))
        self.trials = np.zeros(len(self.prior))
        self.weight = 1.0
        self._rates: np.ndarray | None = None
        self._views: tuple | None = None  # `counts`
        self._prior_view: torch.Tensor | None = None  # `terms`

    def add(self, cell: int, hit: bool) -> None:
        self.add_counts(cell, float(hit), 1.0)

    def add_counts(self, cell: int, hits: float, trials: float) -> None:
        """`hits` successes in `trials` trials at once, either possibly fractional (a calibration
        counts accepted nodes against the sum of their estimates)."""
        self.trials[cell] += self.weight * trials
        self.hits[cell] += self.weight * hits
        self._rates = None

    def add_many(self, cells: np.ndarray, hits: np.ndarray) -> None:
        """One trial of each of `cells` (a cell may repeat), `hits` saying which succeeded: `add` cell by
        cell, in order."""
        np.add.at(self.trials, cells, self.weight)
        np.add.at(self.hits, cells, self.weight * hits.astype(np.float64))
        self._rates = None

    def counts(self) -> tuple:
        """What a kernel that adds trials in place, as `add_many` would, reads and writes (goodput_choice.cpp's
        `learn_counterfactual`): (trials, hits, weight, pools, pool trials, pool hits, pool weight), the
        arrays as tensors over this table's memory; without pools, empty ones. Then call `counted`."""
        if self._views is None:
            self._views = (torch.from_numpy(self.trials), torch.from_numpy(self.hits))
        return (*self._views, self.weight, *NO_POOLS, 0.0)

    def counted(self) -> None:
        """Trials were added in place (`counts`): the rates are made afresh."""
        self._rates = None

    def weights(self) -> tuple[float, float]:
        """(weight, pool weight) as `counts` and `terms` give them: what changes between steps of a kernel bound to
        this table's arrays."""
        return self.weight, 0.0

    def terms(self) -> tuple:
        """What a kernel that makes q(c) of a few cells reads, as `rate_array` makes them (goodput_choice.cpp's
        `template_probabilities`): (trials, hits, prior, weight, prior_steps, pools, pool trials, pool hits,
        pool prior, pool weight), the arrays as tensors over this table's memory; without pools, empty ones."""
        if self._prior_view is None:
            self._prior_view = torch.from_numpy(self._prior)
        return (*self.counts()[:2], self._prior_view, self.weight, self.prior_steps, *NO_POOLS, NO_POOL_PRIOR, 0.0)

    def next_step(self) -> None:
        """Later trials weigh more (the same as decaying earlier ones); renormalise before overflow."""
        self.weight *= self.growth
        if self.weight > 1e100:
            self.hits /= self.weight
            self.trials /= self.weight
            self.weight = 1.0
        self._rates = None

    def _base(self) -> np.ndarray:
        """What a cell is shrunk towards: its prior."""
        return self._prior

    def rate_array(self) -> np.ndarray:
        """q(c) for every cell, as an array (cached until the next `add`; do not write to it)."""
        if self._rates is None:
            pm = self.prior_steps * self.weight  # the prior keeps the weight of prior_steps recent trials
            base, denom = self._base(), self.trials + pm
            if pm > 0:  # every denominator is positive
                self._rates = (self.hits + pm * base) / denom
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    self._rates = np.where(denom > 0, (self.hits + pm * base) / denom, base)
        return self._rates

    def rates(self) -> list[float]:
        """q(c) for every cell."""
        return self.rate_array().tolist()

    def rate(self, cell: int) -> float:
        """q(cell) alone, the same double as `rate_array()[cell]`: a drafter that reads a few cells a step
        (a chain's) then makes those, not every cell's (a dozen numpy calls a step, the caches cold after a
        CPU forward)."""
        if self._rates is not None:
            return float(self._rates[cell])
        pm = self.prior_steps * self.weight
        base, denom = self._base_at(cell), float(self.trials[cell]) + pm
        if pm <= 0 and denom <= 0:
            return base
        return (float(self.hits[cell]) + pm * base) / denom

    def _base_at(self, cell: int) -> float:
        return self.prior[cell]


class PooledRateTable(RateTable):
    """A RateTable whose cells are shrunk towards their pool's rate instead of a fixed prior: a pool
    (`pools[cell]`, a coarser class such as the confidence bin alone) sees every trial of its cells
    and is itself shrunk towards `prior`, averaged over its cells. A cell with few trials so starts from
    what its pool has seen on this text, not from a guess made before any."""

    def __init__(self, prior: Sequence[float], pools: Sequence[int], prior_steps: float = 4.0,
                 half_life: float = 400.0):
        super().__init__(prior, prior_steps, half_life)
        self.pools = list(pools)
        self._pools = np.array(self.pools, dtype=np.int64)
        members: dict[int, list[float]] = {}
        for cell, pool in enumerate(self.pools):
            members.setdefault(pool, []).append(self.prior[cell])
        self.pool = RateTable([sum(members[g]) / len(members[g]) for g in range(max(self.pools) + 1)],
                              prior_steps, half_life)
        self._pool_views: tuple | None = None  # `counts`

    def add(self, cell: int, hit: bool) -> None:
        super().add(cell, hit)
        self.pool.add(self.pools[cell], hit)

    def add_many(self, cells: np.ndarray, hits: np.ndarray) -> None:
        super().add_many(cells, hits)
        self.pool.add_many(self._pools[cells], hits)

    def counts(self) -> tuple:
        if self._pool_views is None:
            self._pool_views = (torch.from_numpy(self._pools),) + self.pool.counts()[:2]
        return (*super().counts()[:3], *self._pool_views, self.pool.weight)

    def counted(self) -> None:
        super().counted()
        self.pool.counted()

    def weights(self) -> tuple[float, float]:
        return self.weight, self.pool.weight

    def terms(self) -> tuple:
        pools, pool_trials, pool_hits = self.counts()[3:6]
        return (*super().terms()[:5], pools, pool_trials, pool_hits, self.pool.terms()[2], self.pool.weight)

    def next_step(self) -> None:
        super().next_step()
        self.pool.next_step()

    def _base(self) -> np.ndarray:
        return self.pool.rate_array()[self._pools]

    def _base_at(self, cell: int) -> float:
        return self.pool.rate(self.pools[cell])

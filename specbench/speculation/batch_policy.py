"""How much to speculate when several requests share a forward (SmartSpec, arXiv 2406.14066, for trees).

A batched step pads every request's rows to the widest one, so it costs t(B, R) (`BatchCost`, from
`measure_batch_cost`). Each step the policy verifies the R that maximises the goodput
G(R) = sum_b (1 + sum_{i < R} p_b(i)) / (t(B, R) + h), R = 1 being batched AR, where h is the measured
host cost of a step of that kind; a tree must beat a plain step by `min_gain`, and while R = 1 wins
the drafters rest for 1, 2, 4, ... 16 steps (SmartSpec: no speculation, no draft). Each request keeps
its R - 1 likeliest nodes, a parent-closed sub-tree; p is the drafter's `Draft.node_probs`,
calibrated on the batch, else per-request rates (`RateTable`). `FixedSpeculation` keeps every draft
whole. How h and p are estimated, and why: docs/batched-serving.md, "How much to speculate".
"""

from __future__ import annotations

import copy
import json
import statistics
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specbench.decoding.transfers import HostCopy, to_device
from specbench.draft import DraftTree, Draft
from specbench.speculation.goodput import (RateTable, counterfactual_path, monotone_down, path_probabilities, subtree_parents)
from specbench.timing import now

MAX_DEPTH, MAX_RANK = 16, 4  # rate cells: depth 1..16 (deeper shares 16's) x sibling rank 0..3 (more shares 3)
CAL_BINS = 10  # a drafter's own estimates are calibrated in bins of width 0.1


def conditional_bins(node_probs: list[float], parents) -> list[int]:
    """Each node's bin of q = p(node) / p(parent), the drafter's probability that it is accepted
    given its parent was (the root's p is 1)."""
    bins = []
    for p, par in zip(node_probs, parents):
        above = 1.0 if par == 0 else node_probs[par - 1]
        q = min(1.0, p / above) if above > 0 else 0.0
        bins.append(min(int(q * CAL_BINS), CAL_BINS - 1))
    return bins


def interp(xs: list, ys: list, x: float) -> float:
    """Piecewise-linear through (xs, ys) (xs increasing), extended linearly past both ends; one point:
    proportional."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = max(1, min(len(xs) - 1, next((k for k, v in enumerate(xs) if v >= x), len(xs) - 1)))
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass
class BatchCost:
    """t(B, R, L): median seconds of one batched forward of B requests x R rows after L cached columns,
    measured at L = `context_len` and, where `long_times` is there, at `long_context_len` too (the
    batched cache is as long as its longest request, so at a large B attention over a long padded
    cache is much of a step)."""

    batches: list[int]
    rows: list[int]
    times: list[list[float]]  # times[i][j]: batches[i] requests, rows[j] rows each, context_len columns
    context_len: int = 0
    device: str = ""
    created: str = ""
    long_context_len: int = 0
    long_times: list[list[float]] | None = None  # the same cells after long_context_len columns

    def t(self, batch: int, rows: int, context: int | None = None) -> float:
        """Piecewise-linear in R, then in B; past the measured range, linear from the last two points.
        With a context and both lengths measured: linear in L between them and beyond the longer one
        (attention is linear in L), the shorter one's time below it."""
        return self.t_rows(batch, [rows], context)[0]

    def t_rows(self, batch: int, rows, context: int | None = None) -> list[float]:
        """t(batch, r, context) for every r in `rows`, interpolating in B and L once (a policy weighs
        every row budget each step). Piecewise-linear interpolation on the grid is separable, so
        interpolating in B first is `t`'s R-then-B up to rounding."""
        def at(table):
            at_batch = [interp(self.batches, [row_times[j] for row_times in table], batch) for j in range(len(self.rows))]
            return [interp(self.rows, at_batch, r) for r in rows]

        short = at(self.times)
        if context is None or not self.long_times or context <= self.context_len:
            return [max(1e-9, s) for s in short]
        f = (context - self.context_len) / (self.long_context_len - self.context_len)
        return [max(1e-9, s + (long - s) * f) for s, long in zip(short, at(self.long_times))]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "BatchCost":
        return cls(**json.loads(Path(path).read_text()))


@torch.inference_mode()
def measure_batch_cost(model, batches=(1, 2, 4, 8, 16), rows=(1, 2, 4, 8, 16, 32, 64), context_len: int = 256,
                       repeats: int = 5, long_context_len: int | None = 1024) -> BatchCost:
    """Time the batched forward as BatchedEngine runs it: B slots of `context_len` cached random tokens,
    R rows each (a chain), the additive mask it builds. Every (B, R) is timed once per round, `repeats`
    rounds after an untimed one, and the median kept: a slow spell of the machine or the first touch of
    a shape then lands on one sample of many cells, not on all samples of one (the policy compares
    cells, so their ratios are what must be right). Seeded random tokens: every profile times the same
    work."""
    from transformers import DynamicCache

    from specbench.decoding.kv_cache import with_cache

    dev = model.device
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    dtype = model.dtype
    contexts = [context_len] + ([long_context_len] if long_context_len else [])
    caches, inputs = {}, {}
    for c in contexts:
        for b in batches:
            prefix = torch.randint(0, vocab, (b, c), generator=g).to(dev)
            caches[c, b] = DynamicCache()
            model(input_ids=prefix, **with_cache(model, caches[c, b]), use_cache=True, logits_to_keep=1)
            for r in rows:
                ok = torch.ones(r, c + r, dtype=torch.bool, device=dev).tril(c)
                inputs[c, b, r] = (torch.randint(0, vocab, (b, r), generator=g).to(dev),
                                   c + torch.arange(r, device=dev).expand(b, r),
                                   torch.zeros(b, 1, r, c + r, dtype=dtype, device=dev).masked_fill_(
                                       ~ok, torch.finfo(dtype).min))
    samples: dict = {cell: [] for cell in inputs}
    for round_ in range(repeats + 1):
        for (c, b, r), (ids, pos, mask) in inputs.items():
            cache = caches[c, b]
            t0 = now(dev)
            model(input_ids=ids, position_ids=pos, attention_mask=mask, **with_cache(model, cache), use_cache=True)
            dt = now(dev) - t0
            cache.crop(-r)  # a negative count removes the step's rows, in every transformers 5.x
            if round_:  # the first round warms every shape up
                samples[c, b, r].append(dt)
    table = lambda c: [[statistics.median(samples[c, b, r]) for r in rows] for b in batches]  # noqa: E731
    return BatchCost(batches=list(batches), rows=list(rows), times=table(context_len), context_len=context_len,
                     device=str(dev), created=time.strftime("%Y-%m-%dT%H:%M:%S"),
                     long_context_len=long_context_len or 0, long_times=table(long_context_len) if long_context_len else None)


def best_row_budget(sorted_p: list[list[float]], cost: BatchCost, max_rows: int, host_s: float = 0.0,
                    context: int | None = None, plain_host_s: float | None = None, min_gain: float = 0.0) -> int:
    """argmax_R sum_b (1 + sum(sorted_p[b][:R - 1])) / (t(B, R, L) + host_s) over R = 1 .. max_rows (ties:
    fewer rows), where R = 1, a step that drafts nothing, pays `plain_host_s` (default: host_s) and
    speculation must beat it by the factor 1 + min_gain (a margin for misjudged rates)."""
    batch = len(sorted_p)
    plain = host_s if plain_host_s is None else plain_host_s
    forward = cost.t_rows(batch, range(1, max_rows + 1), context)

    def step_s(rows: int, h: float) -> float:  # h may be negative: never below a tenth of the forward
        t = forward[rows - 1]
        return max(0.1 * t, t + h)

    best_r, best_rate = 1, (1 + min_gain) * batch / step_s(1, plain)
    expected = float(batch)  # sum_b (1 + sum(sorted_p[b][:R - 1])), grown one row at a time
    for r in range(2, max_rows + 1):
        expected += sum(p[r - 2] for p in sorted_p if len(p) > r - 2)
        rate = expected / step_s(r, host_s)
        if rate > best_rate:
            best_r, best_rate = r, rate
    return best_r


_CELLS: "weakref.WeakKeyDictionary[DraftTree, list[int]]" = weakref.WeakKeyDictionary()


def node_cells(tree: DraftTree) -> list[int]:
    """Each node's rate cell: (depth, rank among its siblings), capped; once per tree (a static
    template is the same object every step)."""
    if tree in _CELLS:
        return _CELLS[tree]
    cells = []
    for node in range(1, tree.size):
        parent = tree.parents[node - 1]
        rank = tree.children[parent].index(node)
        depth = int(tree.depths[node])
        cells.append((min(depth, MAX_DEPTH) - 1) * MAX_RANK + min(rank, MAX_RANK - 1))
    _CELLS[tree] = cells
    return cells


class RunningMean:
    """A decayed mean (each new sample weighs `weight`) that starts at its first sample."""

    def __init__(self, weight: float = 0.1):
        self.value, self.seen, self.weight = 0.0, False, weight

    def add(self, x: float) -> None:
        self.value = self.value + self.weight * (x - self.value) if self.seen else x
        self.seen = True


class AgingMean:
    """A mean of samples whose weights halve every `half_life` ticks, shrunk towards a prior worth
    `prior_weight` fresh samples: old evidence fades back to the prior unless new samples renew it."""

    def __init__(self, half_life: float, prior_weight: float = 1.0):
        self.decay, self.prior_weight = 0.5 ** (1.0 / half_life), prior_weight
        self.total, self.weight = 0.0, 0.0

    def add(self, x: float) -> None:
        self.total += x
        self.weight += 1.0

    def tick(self) -> None:
        self.total *= self.decay
        self.weight *= self.decay

    def value(self, prior: float) -> float:
        return (self.total + self.prior_weight * prior) / (self.weight + self.prior_weight)


class FixedSpeculation:
    """Every request verifies its drafter's whole draft (the padded batch costs the widest one)."""

    name = "fixed"

    def choose(self, drafts: list[Draft | None], keys: list, context: int | None = None) -> list[Draft | None]:
        """Each request's draft, cut or whole; `context`: the batch cache's length L."""
        return drafts

    def observe(self, key, draft: Draft | None, accepted: list[int], emitted: list[int] = ()) -> None:
        """Request `key`'s step: the draft it verified (None: none), the accepted nodes, and the
        tokens it emitted."""

    def observe_step(self, active: int, rows: int, seconds: float, context: int | None = None) -> None:
        """A step of `active` requests padded to `rows` rows each after `context` cached columns took
        `seconds`, host work included."""

    def wants_drafts(self) -> bool:
        """Whether this step's drafters propose at all (else every request decodes plainly)."""
        return True

    def forget(self, key) -> None:
        pass


class BatchGoodput(FixedSpeculation):
    """The row budget with the best expected tokens per second for the batch, each request's best nodes."""

    name = "goodput"

    def __init__(self, cost: BatchCost, max_rows: int = 64, prior_steps: float = 4.0, half_life: float = 200.0,
                 max_skip: int = 16, min_gain: float = 0.05, host_half_life: float = 32.0):
        self.cost, self.max_rows, self.max_skip, self.min_gain = cost, max_rows, max_skip, min_gain
        self.skip_left, self.next_skip = 0, 1  # steps left without drafting; how many the next plain choice skips
        self.drafted = True  # whether the step being timed drafted
        self.prior_steps, self.half_life = prior_steps, half_life
        self.rates: dict = {}
        # every request's outcomes pooled: a new request starts from what the batch has seen (the
        # same method on the same model), not from the prior, so it does not explore afresh
        prior = [0.5 / (1 + r) for _ in range(MAX_DEPTH) for r in range(MAX_RANK)]  # weak: top sibling 1/2
        self.pool = RateTable(prior, prior_steps, half_life)
        # how often a node the drafter put in bin k (given its parent) was accepted, over the batch:
        # its ranking is trusted, its scale checked (a fresh drafter's priors are optimistic)
        self.calibration = RateTable([(k + 0.5) / CAL_BINS for k in range(CAL_BINS)], prior_steps, half_life)
        self.last_budget = 1
        # a step's time beyond the forward's t(B, R) (negative where the curve overstates it), by kind of
        # step: verified a tree, drafted but verified nothing (a probe), did not draft
        self.tree_host, self.probe_host, self.plain_host = AgingMean(host_half_life), RunningMean(), RunningMean()
        # per request: drafts it was given none of, learned from once the tokens after their root are
        # decided: [tree, node tokens (a host copy), node probabilities, tokens decided since]
        self.unverified: dict = {}

    @property
    def host_s(self) -> float:
        """What a step verifying a tree pays beyond t(B, R): the tree steps' aging figure, shrunk
        towards the probes' (drafting alone), or until there was a probe, a plain step's."""
        prior = next((m.value for m in (self.probe_host, self.plain_host) if m.seen), 0.0)
        return self.tree_host.value(prior)

    @property
    def plain_host_s(self) -> float:
        """What a step that drafts nothing pays beyond t(B, 1): measured once there was one, until
        then the drafting steps' figure (so that the first steps do not favour speculation)."""
        return self.plain_host.value if self.plain_host.seen else self.host_s

    def wants_drafts(self) -> bool:
        self.drafted = self.skip_left == 0
        self.skip_left = max(0, self.skip_left - 1)
        return self.drafted

    def observe_step(self, active: int, rows: int, seconds: float, context: int | None = None) -> None:
        beyond = seconds - self.cost.t(active, rows, context)  # signed: see the module's docstring
        self.tree_host.tick()
        (self.tree_host if rows > 1 else self.probe_host if self.drafted else self.plain_host).add(beyond)

    def _table(self, key) -> RateTable:
        if key not in self.rates:
            self.rates[key] = copy.deepcopy(self.pool)
        return self.rates[key]

    def choose(self, drafts: list[Draft | None], keys: list, context: int | None = None) -> list[Draft | None]:
        ranked = []  # per request: (nodes by decreasing p, their p)
        for draft, key in zip(drafts, keys):
            if draft is None or draft.n_extra:  # extra rows (Lookahead's window) are not tree nodes
                ranked.append(([], []))
                continue
            if draft.node_probs is not None:  # the drafter's own estimates (tr_adaptive, tr_fused, EAGLE-2)
                q = self.calibration.rates()
                p = path_probabilities(draft.tree.parents,
                                       [q[k] for k in conditional_bins(draft.node_probs, draft.tree.parents)])
            else:
                q = self._table(key).rates()
                p = monotone_down(path_probabilities(draft.tree.parents, [q[c] for c in node_cells(draft.tree)]),
                                  draft.tree.parents)
            order = sorted(range(len(p)), key=lambda i: (-p[i], i))
            ranked.append(([i + 1 for i in order], [p[i] for i in order]))
        widest = max((len(nodes) for nodes, _ in ranked), default=0) + 1
        budget = best_row_budget([p for _, p in ranked], self.cost, min(self.max_rows, widest), self.host_s, context,
                                 self.plain_host_s, self.min_gain)
        self.last_budget = budget
        if budget == 1:  # no speculation pays now: skip drafting for a while, longer each time
            self.skip_left, self.next_skip = self.next_skip, min(2 * self.next_skip, self.max_skip)
        else:
            self.next_skip = 1
        out = []
        for draft, (nodes, _) in zip(drafts, ranked):
            if draft is None or draft.n_extra:
                out.append(draft if budget > 1 else None)
                continue
            keep = sorted(nodes[: budget - 1])
            if not keep:
                # what it would have accepted is known once its root's next tokens are: learned then
                self.unverified.setdefault(key, []).append([draft.tree, HostCopy(draft.tokens), draft.node_probs, []])
                out.append(None)
                continue
            index = to_device(torch.tensor([v - 1 for v in keep]), draft.tokens.device)
            out.append(Draft(tokens=draft.tokens.index_select(0, index),
                             tree=DraftTree(subtree_parents(keep, draft.tree.parents)),
                             node_probs=None if draft.node_probs is None else [draft.node_probs[v - 1] for v in keep]))
        return out

    def observe(self, key, draft: Draft | None, accepted: list[int], emitted: list[int] = ()) -> None:
        """Learn from the verified draft, and from every earlier unverified draft of this request whose
        would-be accepted path the tokens emitted since have decided."""
        if draft is not None and not draft.n_extra:
            self._learn(key, draft.tree, draft.node_probs, accepted)
        pending = self.unverified.get(key)
        if not pending:
            return
        for entry in pending:
            entry[3].extend(emitted)
        still = []
        for tree, tokens, node_probs, decided in pending:
            node_tokens = [None, *tokens.tolist()]  # node 0, the root, never matches a decided token
            path = counterfactual_path(tree.children, node_tokens, decided)
            if len(path) < len(decided) or not tree.children[path[-1] if path else 0]:
                self._learn(key, tree, node_probs, path)  # a mismatch, or a leaf: the path is final
            else:
                still.append([tree, tokens, node_probs, decided])
        self.unverified[key] = still

    def _learn(self, key, tree: DraftTree, node_probs: list[float] | None, accepted: list[int]) -> None:
        """A trial for every drafted node whose parent was on the accepted path (the root always is)."""
        on_path = {0, *accepted}
        if node_probs is not None:
            for node, k in enumerate(conditional_bins(node_probs, tree.parents), start=1):
                if tree.parents[node - 1] in on_path:
                    self.calibration.add(k, node in on_path)
            self.calibration.next_step()
            return
        tables = (self._table(key), self.pool)
        for node, cell in enumerate(node_cells(tree), start=1):
            if tree.parents[node - 1] in on_path:
                for table in tables:
                    table.add(cell, node in on_path)
        for table in tables:
            table.next_step()

    def forget(self, key) -> None:
        self.rates.pop(key, None)
        self.unverified.pop(key, None)

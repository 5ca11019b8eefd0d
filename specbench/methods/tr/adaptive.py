"""Adaptive Token Recycling: each step verifies the sub-tree of TR's template that the hardware's
cost curve and running acceptance estimates say is worth its forward (possibly none). `GoodputSubtree`
is the chooser (base.py: the drafter is the matrix and a chooser); its math is in
specbench/speculation/goodput.py. `tr_fused` (fused.py) merges a retrieval source into its estimates."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional
from collections import deque
from pathlib import Path

import numpy as np
import torch

from specbench.speculation.cost import StepTimes, load_curve_file, resolve_curve
from specbench.draft import DecodeState, Draft, StepOutcome
from specbench.errors import SettingsError
from specbench.speculation.goodput import (AcceptanceStats, PooledRateTable, RateTable, check_decay, choose_nodes,
                                           counterfactual_path, prior_probabilities,
                                           subtree_parents)
from specbench.registry import register
from specbench.decoding.step import rows_of
from specbench.decoding.transfers import HostCopy, on_host, to_device
from specbench.draft import DraftTree
from specbench.drafting.recycling import Recycling
from specbench.drafting.row_summary import kernel_ready
from specbench.methods.tr.base import TokenRecycling, TRSettings
from specbench.decoding.packed_linear import host_kernels


@dataclass
class AdaptiveTRSettings(TRSettings):
    cost_curve: Optional[str] = None  # None: the run's curve (cost_curve= at the top level); or a curve JSON path
    min_gain: float = 0.05  # draft only when the expected tokens/s beat a plain step's by this fraction
    # auto: per-step node confidences on the CPU (free there), slot statistics on an accelerator (no
    # extra device sync per step); true / false force one or the other
    confidence: Any = "auto"
    half_life: Optional[float] = None  # steps after which an observation counts half; None: 400 (confidence), 200 (slots)
    prior_steps: Optional[float] = None  # weight of the prior, in steps; None: 4 (confidence), 8 (slots)
    prior_per_depth: float = 0.5  # slot prior p(node) = prior_per_depth ** depth / (1 + sibling rank)
    context_buckets: bool = True  # separate statistics for roots the matrix predicted at rank 0 and the rest
    # confidence: separate rates at depth 1, 2 and 3 or more (a node below an accepted one is likelier
    # right than its cell's rate over all depths; false: one rate at every depth, the first design)
    depth_cells: bool = True
    # confidence: a cell with few trials leans on the rate of its confidence bin over every cell (false:
    # on the bin's midpoint, a prior that overstates acceptance)
    pooled_prior: bool = True
    # T > 0 with confidences on the host: each node's siblings are ordered by the target's own
    # position-keyed Gumbel draw over their recycled probabilities (rank 0: the token the target would
    # sample if the recycled row were this position's), as SpS's `coupled` draws its chain; false: by
    # probability alone, as at T = 0
    coupled: bool = True
    # rows priced from the run's own timed forwards: the curve's shape corrected by each width's
    # measured time over the curve's (speculation/online_cost.py); a CPU target only, where the host's
    # clock times the forward (docs/token-recycling.md, "Rows priced from the run's own steps")
    online_cost: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.confidence not in ("auto", None, True, False):
            raise SettingsError(f"method.confidence must be auto, true or false, got {self.confidence!r}")
        check_decay(1 if self.half_life is None else self.half_life, self.prior_steps or 0)


class GoodputSubtree:
    """The chooser that verifies, each step, the sub-tree of TR's template with the most expected
    tokens per second on this hardware, down to a plain step (the math: specbench/speculation/goodput.py).

    Every step expands the whole template from the matrix, as static TR does. Once the tokens after
    that step's root are decided, the template node they would have reached is known whatever was
    drafted, so every node is observed at every step and nothing needs exploring. From these
    counterfactual outcomes and the cost curve t(w), each step takes the best top-m nodes by p(v),
    the estimated probability that v is on the accepted path:

    * `confidence` (default on when the drafter runs on the CPU): p(v) = p(parent) x q(cell of v),
      where the cell is the model's own probability for v's token when its matrix entry was written
      (10 bins, or never written), v's sibling rank (0, 1, 2+) and the context bucket, and q is the
      decayed rate at which such nodes were accepted when their parent was. Confident stretches
      (copies, lists, code) get trees, the rest plain steps. Choosing needs the step's confidences
      on the host, a device sync per step on an accelerator, where a flat cost curve makes the
      choice matter little anyway; there the default is
    * slot statistics: p(v) = the decayed rate at which template node v was on the accepted path,
      per context bucket; the choice changes only when the statistics do and needs nothing from the
      device.

    The context bucket (`context_buckets`) says whether the root was itself its predecessor's
    rank-0 candidate: predictable text goes on being predictable.

    `tr_fused`'s chooser holds one of these for the template's estimates: it counts a node that its
    retrieval drafts too in cells of its own (`agreement_classes` 2) and verifies up to `extra_rows`
    retrieved nodes beside the template's.
    """

    BINS = 10  # confidence bins of width 0.1, plus one for entries never written
    drafted: tuple[int, ...] | None = None

    def __init__(self, settings: AdaptiveTRSettings, target, source: Recycling, agreement_classes: int = 1,
                 extra_rows: int = 0):
        self.settings, self.source, self.tree, self.device = settings, source, source.template, source.device
        self.agreement_classes = agreement_classes
        t = target
        # method.cost_curve, else the curve the runner measured or loaded, else one for the model
        self.curve = resolve_curve(settings.cost_curve or t.hardware_curve, t.model, t.model_name, t.dtype_name)
        # t(w) for w = 1 .. the rows a step may verify, at each step's context: a long context makes rows dearer
        online = bool(settings.online_cost)
        if online and not on_host(self.device):
            print("note: method.online_cost prices rows from forwards the host's clock times: off on "
                  f"{self.device}, where the device runs them asynchronously", file=sys.stderr)
            online = False
        self.times = StepTimes(self.curve, self.tree.size + extra_rows, online=online)
        self.confidence = self.keeps_confidences(settings, target)
        sampler = getattr(t, "sampler", None)
        self.sampler = sampler if (settings.coupled and self.confidence and on_host(self.device)
                                   and sampler is not None and sampler.temperature > 0) else None
        if self.sampler is not None:
            source.couple(self.sampler.temperature)
        # our CPU kernels built (Recycling's constructor asked): the choice in one call of ours too
        self.on_host = on_host(self.device)  # asked once: a device check costs microseconds a step
        self.host_kernels = self.on_host and kernel_ready()
        self.reset()

    @staticmethod
    def check_files(settings: dict) -> None:
        if isinstance(settings["cost_curve"], (str, Path)) and settings["cost_curve"] != "auto":
            load_curve_file(settings["cost_curve"])

    @staticmethod
    def keeps_confidences(settings: AdaptiveTRSettings, target) -> bool:
        confidence = settings.confidence
        return torch.device(target.device).type == "cpu" if confidence in ("auto", None) else bool(confidence)

    def reset(self) -> None:
        """The prior statistics, as built."""
        self.drafted = None
        s = self.settings
        buckets = self._buckets = 2 if s.context_buckets else 1
        ranks = self.tree.sibling_rank()
        prior_steps, half_life = s.prior_steps, s.half_life
        if self.confidence:
            self._rank_class = [min(r, 2) for r in ranks]
            self._depths = 3 if self.settings.depth_cells else 1
            self._depth_class = [min(d, self._depths) - 1 for d in self.tree.depths.tolist()[1:]]
            # each node's cell but for its confidence bin and agreement, as `_cell` numbers them
            self._node_cells = ((np.array(self._depth_class) * 3 + np.array(self._rank_class)) * (self.BINS + 1))
            self._kids = [np.array(c, dtype=np.int64) for c in self.tree.children]  # for `_learn`
            # the same children for our kernel: node v's are kids[start[v] : start[v + 1]]
            self._kid_csr = (torch.tensor(np.cumsum([0] + [len(c) for c in self._kids])),
                             torch.from_numpy(np.concatenate(self._kids)))
            self._node_cells_host = torch.from_numpy(self._node_cells.astype(np.int64))  # for our kernel
            self._parents_host = torch.tensor(self.tree.parents, dtype=torch.long)
            # prior rate of a cell: its confidence bin's midpoint; never-written entries rarely hit
            per_bucket = [(b + 0.5) / self.BINS for b in range(self.BINS)] + [0.02]
            prior = per_bucket * (3 * buckets * self._depths * self.agreement_classes)
            steps, life = prior_steps if prior_steps is not None else 4, half_life if half_life is not None else 400
            # a cell's confidence bin is its index's last digit in base BINS + 1 (_cell)
            self.rates = (PooledRateTable(prior, [c % (self.BINS + 1) for c in range(len(prior))], steps, life)
                          if self.settings.pooled_prior else RateTable(prior, steps, life))
            if self.host_kernels:  # our two per-step kernels bound to this table and template once
                t = self.rates.terms()  # trials, hits, prior, weight, prior steps, pools, their trials, hits, prior
                self._estimate = host_kernels().bind_template_probabilities(
                    self._node_cells_host, self._parents_host, self.BINS, *t[:3], t[4], *t[5:9])
                self._count = host_kernels().bind_learn_counterfactual(*self._kid_csr, *t[:2], *t[5:8])
        else:
            prior = prior_probabilities(self.tree.depths.tolist()[1:], ranks, s.prior_per_depth)
            self.stats = AcceptanceStats(prior, prior_steps if prior_steps is not None else 8,
                                         half_life if half_life is not None else 200, buckets)
        # per step: [root's index, template tokens, confidences, bucket, nodes another source also drafted,
        # every node's rate cell (`probabilities`; None until then)]
        self._pending: deque = deque()
        self._last: tuple[int, torch.Tensor] | None = None  # the previous step's (root index, tokens)
        # (bucket as _bucket says, the step's length bucket on the curve) -> (stats version, nodes)
        self._choice: dict[tuple[int, int | None], tuple[int, tuple[int, ...]]] = {}
        self._subtrees: dict[tuple[int, ...], tuple[DraftTree, torch.Tensor]] = {}
        self._thresholds: dict[int | None, float] = {}  # the curve's context bucket -> _plain_below
        self.times.forget()
        self._times_version = self.times.version  # the tables the two caches above were built on
        self._context: int | None = None  # the last choice's context, for the timed step it drafted
        self.drafted_steps = 0
        self.plain_steps = 0

    # -- what the template would have done ------------------------------------------------------
    def _expand_with_confidence(self, root: int, position: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Template tokens (as `expand`) and, with `confidence`, each node's stored probability; coupled
        (`self.sampler`), siblings in the order of the target's draw at their parent's `position` on."""
        if self.sampler is not None:
            noise = self.sampler.keyed_noise([position + d for d in range(self.tree.max_depth)])
            return self.source.expand_coupled(root, noise, self.sampler.temperature)
        return self.source.expand(root, self.confidence)

    def _cell(self, confidence: float, node: int, bucket: int, agreed: bool = False) -> int:
        b = min(int(confidence * self.BINS), self.BINS - 1) if confidence > 0 else self.BINS
        agreed = agreed and self.agreement_classes > 1
        group = (agreed * self._buckets + bucket) * self._depths + self._depth_class[node - 1]
        return (group * 3 + self._rank_class[node - 1]) * (self.BINS + 1) + b

    def _bucket(self, seq: torch.Tensor) -> int:
        """1 when the root (the last decided token) was its predecessor's rank-0 candidate in the
        previous step's template, else 0. Known whatever the previous step drafted. `seq`: the decided
        tokens on the host."""
        if not self.settings.context_buckets or self._last is None:
            return 0
        root_at, host = self._last
        if self.host_kernels and self.confidence:  # the same walk in one call (decoding/goodput_choice.cpp)
            return host_kernels().template_bucket(host.wait(), seq, root_at + 1, *self._kid_csr)
        tokens = host.tolist()  # the previous step's copy: the engine has synchronised since
        node, hit = 0, False
        for tok in seq.numpy()[root_at + 1 :].tolist():  # the previous step's emitted tokens, root last
            kids = self.tree.children[node]
            if not kids:  # past the template's depth: a fully predicted chain led here
                return 1
            child = next((c for c in kids if tokens[c] == tok), None)
            if child is None:
                return 0
            hit, node = child == kids[0], child
        return int(hit)

    def _learn(self, seq: torch.Tensor) -> None:
        """Count the steps whose continuation is now decided as deep as the template reaches."""
        depth = self.tree.max_depth
        while self._pending and self._pending[0][0] + depth < seq.numel():
            root_at, tokens, conf, bucket, agreed, cells = self._pending.popleft()
            if conf is not None and cells is None:  # the cells the step's estimates were made in
                cells = self._cells(conf.numpy()[1:], bucket, agreed)
            if conf is not None and self.host_kernels:  # the same counts in one call (decoding/goodput_choice.cpp)
                host = tokens.wait() if isinstance(tokens, HostCopy) else tokens
                # the sequence itself and where the continuation starts: no slice made (a torch call a step)
                self._count(host, seq, root_at + 1, depth,
                            cells if isinstance(cells, torch.Tensor) else torch.from_numpy(cells), *self.rates.weights())
                self.rates.counted()
                self.rates.next_step()
                continue
            cont = seq[root_at + 1 : root_at + 1 + depth].tolist()
            path = counterfactual_path(self.tree.children, tokens.tolist(), cont)
            cells = cells.numpy() if isinstance(cells, torch.Tensor) else cells  # the kernel's, made this step
            if conf is None:
                self.stats.add(path, bucket)
                continue
            # a trial for every child of an on-path node, a hit where the child is on the path too
            kids = np.concatenate([self._kids[v] for v in (0, *path)])
            on_path = np.zeros(self.tree.size, dtype=bool)
            on_path[path] = True
            self.rates.add_many(cells[kids - 1], on_path[kids])
            self.rates.next_step()

    # -- choosing --------------------------------------------------------------------------------
    def probabilities(self, bucket: int, conf: torch.Tensor | None, agreed: frozenset = frozenset()) -> list[float]:
        """p(v) for every template node, this step: from the confidences, else slot statistics.
        `agreed`: the nodes another source drafts too (tr_fused)."""
        if conf is None:
            return self.stats.probabilities(bucket)
        if self.host_kernels:  # the same cells and estimates in one call (decoding/goodput_choice.cpp)
            bucket_cells = (self.BINS + 1) * 3 * self._depths  # `_cell`'s numbering
            offset = self._buckets * bucket_cells if agreed and self.agreement_classes > 1 else 0
            cells, p = self._estimate(conf, bucket * bucket_cells, list(agreed) if offset else [], offset,
                                      *self.rates.weights())  # q of these cells alone
            self._pending[-1][5] = cells  # as the kernel made it: the learning kernel reads it as it is
            return p
        cells = self._pending[-1][5] = self._cells(conf.numpy()[1:], bucket, agreed)  # learnt in later, as it was
        q = self.rates.rate_array()[cells]
        p = np.ones(self.tree.size)
        for idx, parent, _ in self.source.host_levels:  # p(v) = p(parent) q(v), one depth at a time
            p[idx] = p[parent] * q[idx - 1]
        return p[1:].tolist()

    def _cells(self, conf: np.ndarray, bucket: int, agreed: frozenset) -> np.ndarray:
        """`_cell` of every template node at once (`conf`: their confidences, root excluded)."""
        c = conf.astype(np.float64)  # binned in double precision, as `_cell` bins a Python float
        bins = np.where(c > 0, np.minimum((c * self.BINS).astype(np.int64), self.BINS - 1), self.BINS)
        group = bucket * self._depths * 3 * (self.BINS + 1)
        cells = self._node_cells + bins + group
        if agreed and self.agreement_classes > 1:
            cells[np.fromiter(agreed, dtype=np.int64) - 1] += self._buckets * self._depths * 3 * (self.BINS + 1)
        return cells

    @property
    def step_times(self) -> list[float]:
        """t(w) for w = 1 .. the rows a step may verify, at the curve's own context."""
        return self.times.at(None)

    def _nodes(self, bucket: int, p: list[float], per_step: bool, context: int | None = None) -> tuple[int, ...]:
        """The sub-tree to draft from this step's p(v) and t(w) after `context` cached tokens: chosen
        afresh with per-step confidences, else only when the slot statistics have changed or the
        context has moved to another of the curve's length buckets (StepTimes)."""
        if per_step:
            return self.choose(p, self.tree.parents, context)
        self._on_times(context)
        step_times = self.times.at(context)
        version = self.stats.version[bucket]
        key = (bucket, self.times.key(context))
        cached = self._choice.get(key)
        if cached is None or cached[0] != version:
            cached = self._choice[key] = (version, choose_nodes(p, self.tree.parents, step_times, self.settings.min_gain))
        return cached[1]

    def choose(self, p: list[float], parents, context: int | None, max_nodes: int | None = None) -> tuple[int, ...]:
        """`choose_nodes` on this step's curve, skipped when no node is likely enough for any draft to
        beat a plain step: m nodes add at most m x max(p) expected tokens, so below `_plain_below`
        every draft's rate is under the plain step's and the choice is the plain step anyway."""
        self._on_times(context)
        if max(p, default=0.0) < self._plain_below(context):
            return ()
        if self.host_kernels:  # the same choice in one call (decoding/goodput_choice.cpp)
            return tuple(host_kernels().choose_nodes(p, parents, self.times.at(context), self.settings.min_gain,
                                                     max_nodes))
        return choose_nodes(p, parents, self.times.at(context), self.settings.min_gain, max_nodes)

    def _on_times(self, context: int | None) -> None:
        """Remember the step's context (`note` learns its forward's time there); drop the choices and
        thresholds built on tables the run's own steps have since corrected (`online_cost`)."""
        self._context = context
        if self._times_version != self.times.version:
            self._choice.clear()
            self._thresholds.clear()
            self._times_version = self.times.version

    def _plain_below(self, context: int | None) -> float:
        """min over m of ((1 + min_gain) t(m + 1) / t(1) - 1) / m on the curve at `context`, less a
        rounding margin: with every node's p below it, (1 + m p) / t(m + 1) < (1 + min_gain) / t(1)."""
        key = self.times.key(context)
        if key not in self._thresholds:
            t, gain = self.times.at(context), self.settings.min_gain
            bound = min(((1 + gain) * t[m] / t[0] - 1) / m for m in range(1, len(t)))
            self._thresholds[key] = bound * (1 - 1e-9) if bound > 0 else 0.0
        return self._thresholds[key]

    def _subtree(self, nodes: tuple[int, ...]) -> tuple[DraftTree, torch.Tensor]:
        hit = self._subtrees.get(nodes)
        if hit is None:
            if len(self._subtrees) > 256:
                self._subtrees.clear()
            hit = self._subtrees[nodes] = (DraftTree(subtree_parents(nodes, self.tree.parents)),
                                           to_device(nodes, self.device, torch.long))
        return hit

    def prepare(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """Learn from what is now decided, then expand the whole template from the root:
        (template tokens on the device, their confidences on the host or None, context bucket)."""
        seq = state.tokens
        if state.step == 0:  # a new turn: earlier steps' continuations are cut off, drop them
            self._pending.clear()
            self._last = None
        self._learn(seq)
        # numpy's view for the reads: after a CPU forward a torch slice or index costs several times numpy's
        host_seq = seq.numpy()
        bucket = self._bucket(seq)
        tokens, conf = self._expand_with_confidence(int(host_seq[-1]), seq.numel() - 1)
        # The template's tokens are read steps later, when the copy has long arrived: started now,
        # waited on then (confidences are read now: on an accelerator the sync the docstring mentions).
        host = HostCopy(tokens, self.on_host)
        host_conf = conf if conf is None or self.on_host else conf.to("cpu")
        self._pending.append([seq.numel() - 1, host, host_conf, bucket, frozenset(), None])
        self._last = (seq.numel() - 1, host)
        return tokens, host_conf, bucket

    def propose(self, state: DecodeState) -> Draft | None:
        tokens, host_conf, bucket = self.prepare(state)
        p = self.probabilities(bucket, host_conf)
        nodes = self._nodes(bucket, p, host_conf is not None, state.tokens.numel() - 1)  # the root is not cached yet
        self.drafted = nodes
        if not nodes:
            self.plain_steps += 1
            return None
        self.drafted_steps += 1
        tree, index = self._subtree(nodes)
        return Draft(tokens=tokens[index], tree=tree, node_probs=[p[v - 1] for v in nodes])

    def agree(self, agreed: frozenset) -> None:
        """This step's template nodes that another source drafts too: the matrix learns them in their
        agreement cells."""
        self._pending[-1][4] = agreed

    def template_tokens(self) -> list[int]:
        """This step's template tokens on the host (waits for the copy `prepare` started)."""
        return self._last[1].tolist()

    def note(self, outcome: StepOutcome) -> None:
        """The step's forward time, for `online_cost` (the counterfactual outcomes are read from the
        decided tokens, `prepare`)."""
        self.times.learn(rows_of(outcome.draft), self._context, outcome.forward_seconds)

    def take_statistics(self) -> dict:
        return {}


@register("tr_adaptive")
class AdaptiveTokenRecycling(TokenRecycling):
    """Token Recycling with the goodput sub-tree chooser."""

    Settings = AdaptiveTRSettings
    Chooser = GoodputSubtree


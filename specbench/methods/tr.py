"""Token Recycling (arXiv 2408.08696): draft from an adjacency matrix of recycled top-k tokens.

After every verification forward, the top-k tokens the model predicted at each row overwrite the
matrix row of that row's token. Drafting expands a static tree template from the root: the r-th
child of a node is rank r of its token's row. The matrix survives across questions (hot start).

Ablations (each a method.<name>= setting): `update=accepted` writes only the rows on the accepted
path (the root's and the accepted nodes'); `prefill_update=true` also writes a row for every prompt
token from the prefill's logits; `cold_start`, `k` and `tree` as named. Every run counts where in
the template acceptance happens (specbench/methods/tr_statistics.py).

`tr_adaptive` drafts, each step, the sub-tree of the template that the hardware's cost curve and
running acceptance estimates say is worth its forward (possibly none); the chooser's math is in
specbench/hardware/goodput.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional
from collections import deque
from pathlib import Path

import torch

from specbench.hardware.cost import load_curve_file, resolve_curve
from specbench.drafter import DecodeState, Draft, Drafter, StepOutcome
from specbench.errors import MissingFileError, SettingsError
from specbench.hardware.goodput import (AcceptanceStats, RateTable, check_decay, choose_nodes, counterfactual_path,
                               path_probabilities, prior_probabilities, subtree_parents)
from specbench.registry import register
from specbench.decoding.transfers import HostCopy, to_device
from specbench.decoding.tree import DraftTree
from specbench.methods.tr_statistics import RecyclingStatistics

# The published template "2.2.2": child counts per node, depth by depth, breadth-first.
# 80 draft nodes, depth 6, nodes per depth 8, 21, 25, 15, 8, 3.
PUBLISHED_TREE = [
    [8],
    [8, 4, 3, 2, 1, 1, 1, 1],
    [8, 3, 2, 1, 1, 1, 1, 1, 2, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0],
    [5, 2, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0],
    [3, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0],
    [2, 0, 0, 1, 0, 0, 0, 0],
]


def load_tree_template(tree) -> list[list[int]]:
    """`published`, a path to a JSON file ({"children": [...]} or the bare list), or the list itself."""
    if tree is None or tree == "published":
        return PUBLISHED_TREE
    if tree == "adaptive":
        raise SettingsError("the adaptive tree is its own method: method=tr_adaptive (its template is "
                            "method.tree, published by default)")
    if isinstance(tree, (str, Path)):
        path = Path(tree)
        if not path.is_file():
            raise MissingFileError(
                f"tree template file '{tree}' not found; give method.tree=published, a JSON file path, "
                f"or an inline list of child counts per depth"
            )
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise SettingsError(f"tree template file '{tree}' is not valid JSON ({e})") from None
        tree = data.get("children") if isinstance(data, dict) else data
    try:
        return [[int(c) for c in level] for level in tree]
    except (TypeError, ValueError):
        raise SettingsError(f"method.tree must list child counts per depth, e.g. [[2],[1,1]]; "
                            f"got {tree!r}") from None


def template_tree(tree, k: int) -> DraftTree:
    """The template as a tree, refused when it is empty or malformed or a node has more children
    than the matrix keeps candidates (k) per row."""
    if k < 1:
        raise SettingsError(f"Token Recycling needs k >= 1 candidates per matrix row, got method.k={k}")
    template = DraftTree.from_children_counts(load_tree_template(tree))
    ranks = template.sibling_rank()
    if max(ranks) >= k:
        raise SettingsError(
            f"the tree template gives a node {max(ranks) + 1} children but the matrix keeps only "
            f"k={k} tokens per row; raise method.k or trim the template"
        )
    return template


UPDATE_RULES = ("all_rows", "accepted")


def check_update(update: str) -> None:
    if update not in UPDATE_RULES:
        raise SettingsError(f"method.update must be one of {', '.join(UPDATE_RULES)} (all_rows: the paper, "
                            f"every verified row; accepted: the accepted path only), got {update!r}")


@dataclass
class TRSettings:
    k: int = 8  # candidates kept per adjacency-matrix row
    tree: Any = "published"  # published | path/to/tree.json | inline list of child counts per depth
    cold_start: bool = False  # true: reset the matrix before every question (the paper uses hot start)
    # all_rows: every verified row overwrites its token's matrix row (the paper); accepted: only the
    # accepted path's rows (root + accepted nodes)
    update: str = "all_rows"
    prefill_update: bool = False  # true: also write a row for every prompt token from the prefill's logits


@register("tr")
class TokenRecycling(Drafter):
    Settings = TRSettings

    def __init__(self, target=None, settings: TRSettings | None = None, **values):
        super().__init__(target, settings, **values)
        s = self.settings
        vocab_size, device = self.target.vocab_size, self.target.device
        k, tree, cold_start, update, prefill_update = s.k, s.tree, s.cold_start, s.update, s.prefill_update
        check_update(update)
        self.k = k
        self.cold_start = cold_start
        self.update = update
        self.needs_prompt_logits = bool(prefill_update)
        self.tree = template_tree(tree, k)
        ranks = self.tree.sibling_rank()
        self.device = torch.device(device)
        parents = torch.tensor((0,) + self.tree.parents, device=self.device)
        rank = torch.tensor([0] + ranks, device=self.device)
        depths = self.tree.depths
        # Per depth: the node indices, their parents' indices and their ranks, for one gather each.
        self._levels = []
        for d in range(1, self.tree.max_depth + 1):
            idx = torch.nonzero(depths == d).flatten().to(self.device)
            self._levels.append((idx, parents[idx], rank[idx]))
        # int32 suffices for any vocabulary; the matrix is vocab x k (under 2 MB for 50k x 8).
        self.matrix = torch.zeros(vocab_size, k, dtype=torch.int32, device=self.device)
        self.written = torch.zeros(vocab_size, dtype=torch.bool, device=self.device)
        self.statistics = RecyclingStatistics(self.tree, self.device)
        self._drafted: tuple[int, ...] | None = None  # template nodes drafted this step (None: all)

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        p = super().check_settings(params, target)
        template_tree(p["tree"], p["k"])
        check_update(p["update"])
        return p

    def start_question(self) -> None:
        if self.cold_start:
            self.matrix.zero_()
            self.written.zero_()

    def reset(self) -> None:
        self.matrix.zero_()
        self.written.zero_()
        self.statistics.clear()
        self._drafted = None

    def take_statistics(self) -> dict:
        return self.statistics.take()

    def share_learned_state(self, other: "TokenRecycling") -> None:
        """One matrix for every request of a batch, as one TR server would keep it."""
        self.matrix, self.written = other.matrix, other.written
        if hasattr(other, "probs"):  # tr_adaptive's confidences travel with their rows
            self.probs = other.probs

    def expand(self, root: int) -> torch.Tensor:
        """The token of every template node, root first: (tree.size,) on the drafter's device."""
        tokens = torch.empty(self.tree.size, dtype=torch.long, device=self.device)
        tokens[:1].fill_(root)  # a scalar fill, so no host-to-device copy on an accelerator
        for idx, parent, rank in self._levels:
            tokens[idx] = self.matrix[tokens[parent], rank].long()
        return tokens

    def propose(self, state: DecodeState) -> Draft:
        return Draft(tokens=self.expand(int(state.tokens[-1]))[1:], tree=self.tree)

    def observe(self, outcome: StepOutcome) -> None:
        root, first = outcome.root, (outcome.emitted or [outcome.bonus])[0]
        self._count(outcome, *self._root_facts(root, first))  # the matrix before this step's writes
        self._write(*self._rows(outcome, torch.full((1,), root, dtype=torch.long, device=self.device)))

    @classmethod
    def observe_batch(cls, drafters: list["TokenRecycling"], outcomes: list[StepOutcome]) -> None:
        """Count each request's step, then write every verified row of the requests that share a matrix
        with one top-k and one write: request by request, each would pay its own handful of small tensor
        operations, and a batch that decodes plainly would pay them B times a step for one row each.
        A token two requests write keeps the later request's row, as if they observed in turn."""
        shared: dict[int, list[int]] = {}
        for i, d in enumerate(drafters):
            shared.setdefault(id(d.matrix), []).append(i)
        for members in shared.values():
            owner = drafters[members[0]]
            if len(members) == 1:
                owner.observe(outcomes[members[0]])
                continue
            outs = [outcomes[i] for i in members]
            roots, firsts = to_device([[o.root for o in outs], [(o.emitted or [o.bonus])[0] for o in outs]],
                                      owner.device, torch.long)
            unwritten, rank0_hits = owner._root_facts(roots, firsts)  # the matrix before this step's writes
            tokens, logits = [], []
            for j, (i, o) in enumerate(zip(members, outs)):
                drafters[i]._count(o, unwritten[j], rank0_hits[j])
                t, rows = drafters[i]._rows(o, roots[j : j + 1])
                tokens.append(t)
                logits.append(rows)
            owner._write(torch.cat(tokens), torch.cat(logits))

    def observe_prompt(self, prompt: torch.Tensor, logits: torch.Tensor) -> None:
        """prefill_update: a row for every prompt token; a token seen twice keeps its last row."""
        last = {t: i for i, t in enumerate(prompt.tolist())}
        at = to_device(list(last.values()), logits.device, torch.long)
        self._write(to_device(list(last), self.device, torch.long), logits[at], duplicates=False)

    def _root_facts(self, roots, firsts) -> tuple[torch.Tensor, torch.Tensor]:
        """Per root (a token, or a tensor of them): whether its matrix row was never written, and
        whether its rank-0 entry is the token the target chose after it (`firsts`); bool tensors on
        the drafter's device."""
        written = self.written[roots]
        return ~written, (self.matrix[roots, 0] == firsts) & written

    def _count(self, outcome: StepOutcome, root_unwritten: torch.Tensor, rank0_hit: torch.Tensor) -> None:
        """Per-node and matrix statistics (the root's facts from `_root_facts`, before the matrix
        learns from this step). With a chosen node set (`_drafted`: tr_adaptive's sub-tree, tr_fused's
        merged tree) draft ids map back to those nodes; only template nodes (ids up to len(tree)) are
        counted."""
        nodes, n = self._drafted, len(self.tree)
        accepted = outcome.accepted if nodes is None else [nodes[a - 1] for a in outcome.accepted]
        drafted = () if outcome.draft is None else None if nodes is None else tuple(v for v in nodes if v <= n)
        self.statistics.record([v for v in accepted if v <= n], drafted, root_unwritten, rank0_hit)

    def _rows(self, outcome: StepOutcome, root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The matrix rows this step overwrites, (their tokens, their logits): every verified row
        (update=all_rows, the paper) or the accepted path's (update=accepted). `root`: the root's token
        as a 1-element tensor on the drafter's device."""
        draft = outcome.draft
        if draft is None:
            return root, outcome.logits[:1]
        tokens = torch.cat([root, draft.tokens.to(self.device)])
        if self.update == "all_rows":
            return tokens, outcome.logits[: tokens.numel()]
        rows = to_device([0, *outcome.accepted], outcome.logits.device, torch.long)
        return tokens[rows.to(self.device)], outcome.logits[rows]

    def _write(self, tokens: torch.Tensor, logits: torch.Tensor, duplicates: bool = True):
        """Rows `tokens` of the matrix <- the top-k of `logits` (one row each); a token on several
        rows gets its last row's. Returns (the top-k, each row's last row of its token)."""
        top = logits.topk(self.k, dim=-1)
        last = last_occurrence(tokens) if duplicates else torch.arange(tokens.numel(), device=tokens.device)
        self.matrix[tokens] = top.indices[last].to(device=self.device, dtype=torch.int32)
        self.written[tokens] = True
        return top, last


def last_occurrence(tokens: torch.Tensor) -> torch.Tensor:
    """For each position i, the last position holding the token tokens[i].

    A write `matrix[tokens] = rows` with a token on several rows leaves which row wins to the device:
    the CPU keeps the last, CUDA's index_put_ any of them (a row can even mix two). Gathering every
    duplicate's value from the same last row first makes all writes of a token carry one value, so
    their order no longer matters. A step writes at most a tree's rows, so the (rows x rows) comparison
    is cheaper than anything vocabulary-sized (the prompt's rows, which can be thousands, are written
    without duplicates and skip it), and the same on every device."""
    order = torch.arange(tokens.numel(), device=tokens.device)
    same = tokens[:, None] == tokens[None, :]
    return torch.where(same, order[None, :], -1).amax(dim=1)


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


@register("tr_adaptive")
class AdaptiveTokenRecycling(TokenRecycling):
    """Token Recycling that verifies, each step, the sub-tree of its template with the most expected
    tokens per second on this hardware, down to a plain step (the math: specbench/hardware/goodput.py).

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
    """

    BINS = 10  # confidence bins of width 0.1, plus one for entries never written

    Settings = AdaptiveTRSettings

    def __init__(self, target=None, settings: AdaptiveTRSettings | None = None, **values):
        super().__init__(target, settings, **values)
        s, t = self.settings, self.target
        cost_curve, min_gain, confidence, context_buckets = s.cost_curve, s.min_gain, s.confidence, s.context_buckets
        half_life, prior_steps, prior_per_depth = s.half_life, s.prior_steps, s.prior_per_depth
        hardware_curve, model, model_name, dtype_name = t.hardware_curve, t.model, t.model_name, t.dtype_name
        # method.cost_curve, else the curve the runner measured or loaded, else one for the model
        self.curve = resolve_curve(cost_curve or hardware_curve, model, model_name, dtype_name)
        self.step_times = self.curve.table(self.tree.size)  # t(w) for w = 1 .. template rows
        self.min_gain = float(min_gain)
        self.context_buckets = bool(context_buckets)
        self.confidence = self.device.type == "cpu" if confidence in ("auto", None) else bool(confidence)
        self._prior_steps, self._half_life, self._prior_per_depth = prior_steps, half_life, prior_per_depth
        self.reset()

    def reset(self) -> None:
        """An empty matrix and the prior statistics, as built."""
        super().reset()
        buckets = 2 if self.context_buckets else 1
        ranks = self.tree.sibling_rank()
        prior_steps, half_life = self._prior_steps, self._half_life
        if self.confidence:
            self.probs = torch.zeros(self.matrix.shape, dtype=torch.float32, device=self.device)
            self._rank_class = [min(r, 2) for r in ranks]
            # prior rate of a cell: its confidence bin's midpoint; never-written entries rarely hit
            per_bucket = [(b + 0.5) / self.BINS for b in range(self.BINS)] + [0.02]
            self.rates = RateTable(per_bucket * (3 * buckets), prior_steps if prior_steps is not None else 4,
                                   half_life if half_life is not None else 400)
        else:
            prior = prior_probabilities(self.tree.depths.tolist()[1:], ranks, self._prior_per_depth)
            self.stats = AcceptanceStats(prior, prior_steps if prior_steps is not None else 8,
                                         half_life if half_life is not None else 200, buckets)
        self._pending: deque = deque()  # per step: (root's index, template tokens, confidences, bucket)
        self._last: tuple[int, torch.Tensor] | None = None  # the previous step's (root index, tokens)
        self._choice: dict[int, tuple[int, tuple[int, ...]]] = {}  # bucket -> (stats version, nodes)
        self._subtrees: dict[tuple[int, ...], tuple[DraftTree, torch.Tensor]] = {}
        self.drafted_steps = 0
        self.plain_steps = 0

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        p = super().check_settings(params, target)
        if isinstance(p["cost_curve"], (str, Path)) and p["cost_curve"] != "auto":
            load_curve_file(p["cost_curve"])
        if p["confidence"] not in ("auto", None, True, False):
            raise SettingsError(f"method.confidence must be auto, true or false, got {p['confidence']!r}")
        check_decay(1 if p["half_life"] is None else p["half_life"], p["prior_steps"] or 0)
        return p

    def start_question(self) -> None:
        super().start_question()
        if self.cold_start and self.confidence:  # a reset matrix holds no confidence either
            self.probs.zero_()

    # -- what the template would have done ------------------------------------------------------
    def _expand_with_confidence(self, root: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Template tokens (as `expand`) and, with `confidence`, each node's stored probability."""
        if not self.confidence:
            return self.expand(root), None
        tokens = torch.empty(self.tree.size, dtype=torch.long, device=self.device)
        conf = torch.ones(self.tree.size, dtype=torch.float32, device=self.device)
        tokens[:1].fill_(root)
        for idx, parent, rank in self._levels:
            src = tokens[parent]
            tokens[idx] = self.matrix[src, rank].long()
            conf[idx] = self.probs[src, rank]
        return tokens, conf

    def _cell(self, confidence: float, node: int, bucket: int) -> int:
        b = min(int(confidence * self.BINS), self.BINS - 1) if confidence > 0 else self.BINS
        return (bucket * 3 + self._rank_class[node - 1]) * (self.BINS + 1) + b

    def _bucket(self, seq: torch.Tensor) -> int:
        """1 when the root (the last decided token) was its predecessor's rank-0 candidate in the
        previous step's template, else 0. Known whatever the previous step drafted."""
        if not self.context_buckets or self._last is None:
            return 0
        root_at, host = self._last
        tokens = host.tolist()  # the previous step's copy: the engine has synchronised since
        node, hit = 0, False
        for tok in seq[root_at + 1 :].tolist():  # the previous step's emitted tokens, root last
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
            root_at, tokens, conf, bucket = self._pending.popleft()
            cont = seq[root_at + 1 : root_at + 1 + depth].tolist()
            path = counterfactual_path(self.tree.children, tokens.tolist(), cont)
            if conf is None:
                self.stats.add(path, bucket)
                continue
            conf = conf.tolist()
            on_path = [0, *path]
            for i, parent in enumerate(on_path):  # a trial for every child of an on-path node
                nxt = on_path[i + 1] if i + 1 < len(on_path) else -1
                for child in self.tree.children[parent]:
                    self.rates.add(self._cell(conf[child], child, bucket), child == nxt)
            self.rates.next_step()

    # -- choosing --------------------------------------------------------------------------------
    def _probabilities(self, bucket: int, conf: torch.Tensor | None) -> list[float]:
        """p(v) for every template node, this step: from the confidences, else slot statistics."""
        if conf is None:
            return self.stats.probabilities(bucket)
        rates = self.rates.rates()
        c = conf.tolist()
        q = [rates[self._cell(c[v], v, bucket)] for v in range(1, self.tree.size)]
        return path_probabilities(self.tree.parents, q)

    def _nodes(self, bucket: int, p: list[float], per_step: bool) -> tuple[int, ...]:
        """The sub-tree to draft from this step's p(v): chosen afresh with per-step confidences, else
        only when the slot statistics have changed."""
        if per_step:
            return choose_nodes(p, self.tree.parents, self.step_times, self.min_gain)
        version = self.stats.version[bucket]
        cached = self._choice.get(bucket)
        if cached is None or cached[0] != version:
            cached = self._choice[bucket] = (version, choose_nodes(p, self.tree.parents, self.step_times,
                                                                   self.min_gain))
        return cached[1]

    def _subtree(self, nodes: tuple[int, ...]) -> tuple[DraftTree, torch.Tensor]:
        hit = self._subtrees.get(nodes)
        if hit is None:
            if len(self._subtrees) > 256:
                self._subtrees.clear()
            hit = self._subtrees[nodes] = (DraftTree(subtree_parents(nodes, self.tree.parents)),
                                           to_device(nodes, self.device, torch.long))
        return hit

    def _prepare(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """Learn from what is now decided, then expand the whole template from the root:
        (template tokens on the device, their confidences on the host or None, context bucket)."""
        seq = state.tokens
        if state.step == 0:  # a new turn: earlier steps' continuations are cut off, drop them
            self._pending.clear()
            self._last = None
        self._learn(seq)
        bucket = self._bucket(seq)
        tokens, conf = self._expand_with_confidence(int(seq[-1]))
        # The template's tokens are read steps later, when the copy has long arrived: started now,
        # waited on then (confidences are read now: on an accelerator the sync the docstring mentions).
        host = HostCopy(tokens)
        host_conf = None if conf is None else conf.to("cpu")
        self._pending.append((seq.numel() - 1, host, host_conf, bucket))
        self._last = (seq.numel() - 1, host)
        return tokens, host_conf, bucket

    def propose(self, state: DecodeState) -> Draft | None:
        tokens, host_conf, bucket = self._prepare(state)
        p = self._probabilities(bucket, host_conf)
        nodes = self._nodes(bucket, p, host_conf is not None)
        self._drafted = nodes
        if not nodes:
            self.plain_steps += 1
            return None
        self.drafted_steps += 1
        tree, index = self._subtree(nodes)
        return Draft(tokens=tokens[index], tree=tree, node_probs=[p[v - 1] for v in nodes])

    def _write(self, tokens: torch.Tensor, logits: torch.Tensor, duplicates: bool = True):
        top, last = super()._write(tokens, logits, duplicates)
        if self.confidence:  # the model's probability of each recycled candidate, kept beside it
            probs = logits.softmax(dim=-1, dtype=torch.float32).gather(-1, top.indices)  # one fused pass
            self.probs[tokens] = probs[last].to(self.device)
        return top, last

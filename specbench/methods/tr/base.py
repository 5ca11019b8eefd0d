"""Token Recycling (arXiv 2408.08696): draft from an adjacency matrix of recycled top-k tokens.

After every verification forward, the top-k tokens the model predicted at each row overwrite the
matrix row of that row's token. Drafting expands a static tree template from the root: the r-th
child of a node is rank r of its token's row. The matrix survives across questions (hot start).

Ablations (each a method.<name>= setting): `update=accepted` writes only the rows on the accepted
path (the root's and the accepted nodes'); `prefill_update=true` also writes a row for every prompt
token from the prefill's logits; `cold_start`, `k` and `tree` as named. Every run counts where in
the template acceptance happens (specbench/methods/tr/statistics.py).

`tr_adaptive` drafts, each step, the sub-tree of the template that the hardware's cost curve and
running acceptance estimates say is worth its forward (possibly none); the chooser's math is in
specbench/speculation/goodput.py.
"""

from __future__ import annotations

import json
from collections import namedtuple
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import numpy as np
import torch

from specbench.draft import DecodeState, Draft, StepOutcome
from specbench.drafter import Drafter, LearnsAcrossRequests, ReadsPromptLogits
from specbench.errors import MissingFileError, SettingsError
from specbench.registry import register
from specbench.decoding.transfers import on_host, to_device
from specbench.draft import DraftTree
from specbench.methods.tr.statistics import RecyclingStatistics

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

    def __post_init__(self):
        template_tree(self.tree, self.k)  # a tree that cannot be read or built, a k it does not fit
        check_update(self.update)


@register("tr")
class TokenRecycling(Drafter, ReadsPromptLogits, LearnsAcrossRequests):
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
        self.reads_prompt_logits = bool(prefill_update)
        self.tree = template_tree(tree, k)
        ranks = self.tree.sibling_rank()
        self.device = torch.device(device)
        parents = torch.tensor((0,) + self.tree.parents, device=self.device)
        rank = torch.tensor([0] + ranks, device=self.device)
        depths = self.tree.depths
        # Per depth: the node indices, their parents' indices and their ranks, for one gather each.
        self._levels = []
        self._host_levels = []  # the same as numpy arrays, for the CPU path of expand_with
        host_parents, host_rank = np.array((0,) + self.tree.parents), np.array([0] + ranks)
        for d in range(1, self.tree.max_depth + 1):
            idx = torch.nonzero(depths == d).flatten()
            self._host_levels.append((idx.numpy(), host_parents[idx.numpy()], host_rank[idx.numpy()]))
            idx = idx.to(self.device)
            self._levels.append((idx, parents[idx], rank[idx]))
        # int32 suffices for any vocabulary; the matrix is vocab x k (under 2 MB for 50k x 8).
        self.matrix = torch.zeros(vocab_size, k, dtype=torch.int32, device=self.device)
        self.written = torch.zeros(vocab_size, dtype=torch.bool, device=self.device)
        self.statistics = RecyclingStatistics(self.tree, self.device)
        self._drafted: tuple[int, ...] | None = None  # template nodes drafted this step (None: all)

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

    def expand(self, root: int) -> torch.Tensor:
        """The token of every template node, root first: (tree.size,) on the drafter's device."""
        return self.expand_with(root, None)[0]

    def expand_with(self, root: int, probs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the template's tokens as `expand`, and with `probs`, a (vocab, k) table beside the matrix,
        each node's entry of it, the root's 1). On a CPU the gathers run in numpy over views of the
        matrix: a dozen small torch indexing calls cost several times more there than the gathers."""
        if on_host(self.device):
            matrix, table = self.matrix.numpy(), None if probs is None else probs.numpy()
            tokens = np.empty(self.tree.size, dtype=np.int64)
            conf = None if table is None else np.ones(self.tree.size, dtype=np.float32)
            tokens[0] = root
            for idx, parent, rank in self._host_levels:
                src = tokens[parent]
                tokens[idx] = matrix[src, rank]
                if conf is not None:
                    conf[idx] = table[src, rank]
            return torch.from_numpy(tokens), None if conf is None else torch.from_numpy(conf)
        tokens = torch.empty(self.tree.size, dtype=torch.long, device=self.device)
        conf = None if probs is None else torch.ones(self.tree.size, dtype=torch.float32, device=self.device)
        tokens[:1].fill_(root)  # a scalar fill, so no host-to-device copy on an accelerator
        for idx, parent, rank in self._levels:
            src = tokens[parent]
            tokens[idx] = self.matrix[src, rank].long()
            if conf is not None:
                conf[idx] = probs[src, rank]
        return tokens, conf

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
        the drafter's device, or for one root on a CPU two bools."""
        if isinstance(roots, int) and on_host(self.device):  # plain numbers: no tensor to make
            written = bool(self.written.numpy()[roots])
            return not written, written and int(self.matrix.numpy()[roots, 0]) == firsts
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
        top = top_k_rows(logits, self.k)
        last = last_occurrence(tokens) if duplicates else torch.arange(tokens.numel(), device=tokens.device)
        self.matrix[tokens] = top.indices[last].to(device=self.device, dtype=torch.int32)
        # a device value: `= True` copies a host scalar in and stalls the host (sync_audit.py)
        self.written[tokens] = torch.ones_like(tokens, dtype=torch.bool)
        return top, last


TopK = namedtuple("TopK", "values indices")


def top_k_rows(logits: torch.Tensor, k: int, block: int = 64) -> TopK:
    """`logits.topk(k, dim=-1)` of a 2-D tensor: the same values and, but for exact ties, the same
    indices, several times faster on a CPU, where torch's topk over a large vocabulary is the largest
    cost of TR's steps outside the forward (docs/token-recycling.md). Each row's top k lie in the
    k blocks with the largest maxima: were an element of the top k outside them, those k maxima
    would all be at least as large. So: block maxima, their top k, then the top k of those blocks'
    elements. Static shapes throughout; other devices, or a vocabulary not a multiple of `block`,
    take torch's topk."""
    rows, vocab = logits.shape
    if logits.device.type != "cpu" or vocab % block or vocab // block < k:
        return TopK(*logits.topk(k, dim=-1))
    blocks = logits.reshape(rows, vocab // block, block)  # a view when the rows are contiguous
    chosen = blocks.amax(dim=-1).topk(k, dim=-1).indices  # (rows, k) block numbers
    cand = blocks.gather(1, chosen[..., None].expand(rows, k, block)).reshape(rows, k * block)
    best = cand.topk(k, dim=-1)
    where = chosen.gather(1, best.indices // block) * block + best.indices % block
    return TopK(best.values, where)


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

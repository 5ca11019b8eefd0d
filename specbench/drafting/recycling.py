"""Token Recycling's adjacency matrix (arXiv 2408.08696), the drafting source of `tr`, its variants and
SAM-Decoding's fallback tree.

The matrix holds, for every vocabulary token, the k tokens the target ranked highest the last time it
verified a row of that token. After every verification forward the top-k of each verified row's logits
overwrite its token's row (`update=all_rows`, the paper; `accepted`: the accepted path's rows only).
Drafting expands a static template from the root, breadth-first: the r-th child of a node is rank r
of its token's row, one gather per depth. The matrix survives across questions (hot start) unless
`cold_start`. With confidences, each entry also keeps the probability the target gave it when it was
written (what `tr_adaptive` and `tr_fused` estimate acceptance from).

Example: with k = 2 and row 4 = [7, 8], row 7 = [1, 2], the template [[2], [1, 0]] expanded from the
root 4 drafts 7 and 8 below it, and 1 below 7.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specbench.decoding.sampling import KeyedNoise, gumbel_table
from specbench.decoding.transfers import on_host, on_host_now, to_device
from specbench.draft import DraftTree, StepOutcome
from specbench.drafting.recycling_statistics import RecyclingStatistics
from specbench.drafting.row_summary import kernel_ready, probabilities, row_summary
from specbench.errors import MissingFileError, SettingsError
from specbench.decoding.packed_linear import host_kernels

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
UPDATE_RULES = ("all_rows", "accepted")


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


def check_update(update: str) -> None:
    if update not in UPDATE_RULES:
        raise SettingsError(f"method.update must be one of {', '.join(UPDATE_RULES)} (all_rows: the paper, "
                            f"every verified row; accepted: the accepted path only), got {update!r}")


@dataclass
class RecyclingSettings:
    """The matrix's settings, as every method drafting from it names them (method.<name>=)."""

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


def coupling_tables(probs: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """What `coupled_expansion` reads of matrix rows with probabilities `probs` (rows, k), apart from the
    noise: -log(p) / T per candidate, and log of the rows' tail bound (1 - sum p) p_min^(1/T - 1).
    Kept beside the matrix (`Recycling.couple`), they cost once per written row, not once per read. Where
    our CPU kernels run they are made there (decoding/row_summary.cpp, which also refreshes a step's rows as
    it writes them): the same definition in its own float32 rounding."""
    if kernel_ready():
        neg_log_p, log_tail = host_kernels().coupling_tables(torch.from_numpy(probs), temperature)
        return neg_log_p.numpy(), log_tail.numpy()
    inv_t = 1.0 / temperature
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        neg_log_p = -(np.log(probs) * inv_t)
        tail = np.maximum(1.0 - probs.sum(axis=1), 0.0) * probs.min(axis=1) ** (inv_t - 1.0)
        return neg_log_p, np.log(tail)


def coupled_expansion(matrix: np.ndarray, probs: np.ndarray, levels, root: int, noise: list[np.ndarray],
                      temperature: float, tables: tuple[np.ndarray, np.ndarray] | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The template expanded with each parent's candidates in the order of the target's own draw.

    The target samples argmax(log p / T + g) with Gumbel noise g keyed by the row's absolute position
    (decoding/sampling.py). A matrix row holds a token's top-k candidates and their probabilities p
    when recycled; below a parent at depth d the noise of the parent's row, `noise[d]` (vocabulary-wide),
    is known, so the candidates are sorted by log p / T + g (Gumbel-top-k: a draw without replacement
    from the recycled distribution, coupled to the target's draw). Rank 0 is then the token the target
    samples whenever the recycled row is this position's and the sample lies in the top k. Its
    confidence is the chance of that given the row: no token outside the top k beats its score,
    exp(-Z_tail e^-s), with the tail's tempered mass Z_tail bounded by (1 - sum p) p_min^(1/T - 1);
    the other ranks keep their recycled probability.

    matrix, probs: (vocab, k); levels: per depth, (node ids, their parents' ids, their sibling ranks),
    as `Recycling.host_levels`; `tables`: `coupling_tables` of every matrix row, else made here from the
    rows read. Returns (tokens, confidences), one per template node, root first."""
    size = 1 + sum(len(idx) for idx, _, _ in levels)
    tokens = np.empty(size, dtype=np.int64)
    conf = np.ones(size, dtype=np.float32)
    tokens[0] = root
    # an unwritten row has probability 0: score -inf, confidence 0 (masked below)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for d, (idx, parent, rank) in enumerate(levels):
            src = tokens[parent]
            cand, p = matrix[src], probs[src]  # (nodes at this depth, k)
            neg_log_p, log_tail = coupling_tables(p, temperature) if tables is None else (tables[0][src], tables[1][src])
            neg_score = neg_log_p - noise[d][cand]  # -(log p / T + g): ascending is the draw's order
            rows = np.arange(len(idx))
            pick = np.argsort(neg_score, axis=1, kind="stable")[rows, rank]
            tokens[idx] = cand[rows, pick]
            c = p[rows, pick]
            win = np.exp(-np.exp(log_tail + neg_score[rows, pick]))  # tail 0: log -inf, win 1
            conf[idx] = np.where((rank == 0) & (c > 0), win, c)
    return tokens, conf


class Recycling:
    """The matrix, its template and the counts of where in the template acceptance happens.

    `matrix` (vocab, k) int32, `written` (vocab,) bool and, with `confidences`, `probs` (vocab, k)
    float32 live on `device`. Drafters that share one (`share`) learn into and draft from one matrix."""

    def __init__(self, settings: RecyclingSettings, vocab_size: int, device, confidences: bool = False):
        self.settings = settings
        self.k = int(settings.k)
        self.template = template_tree(settings.tree, self.k)
        self.device = torch.device(device)
        ranks = self.template.sibling_rank()
        parents = torch.tensor((0,) + self.template.parents)
        rank = torch.tensor([0] + ranks)
        # Per depth: the node indices, their parents' indices and their ranks, for one gather each;
        # on the host as numpy arrays too, for the CPU path of `expand`.
        self.levels, self.host_levels = [], []
        for d in range(1, self.template.max_depth + 1):
            idx = torch.nonzero(self.template.depths == d).flatten()
            self.host_levels.append((idx.numpy(), parents[idx].numpy(), rank[idx].numpy()))
            self.levels.append(tuple(t.to(self.device) for t in (idx, parents[idx], rank[idx])))
        # every node's parent, sibling rank and depth, root first, for our expansion kernel (parents first)
        self.host_nodes = (parents, rank, self.template.depths.to(torch.long))
        # int32 suffices for any vocabulary; the matrix is vocab x k (under 2 MB for 50k x 8).
        self.matrix = torch.zeros(vocab_size, self.k, dtype=torch.int32, device=self.device)
        self.written = torch.zeros(vocab_size, dtype=torch.bool, device=self.device)
        self.probs = (torch.zeros(vocab_size, self.k, dtype=torch.float32, device=self.device)
                      if confidences else None)
        self.temperature: float | None = None  # `couple`: the coupling tables kept for this temperature
        self.tables: tuple[np.ndarray, np.ndarray] | None = None
        self._table_views: tuple[torch.Tensor, torch.Tensor] | None = None  # the same memory, for our kernels
        self.statistics = RecyclingStatistics(self.template, self.device)
        self._keep_views()
        if on_host(self.device):
            kernel_ready()  # the row summary's kernel built now, before anything is timed

    def _keep_views(self) -> None:
        """numpy views of the matrix, `written` and `probs` on the host (None elsewhere): made once, since
        each `.numpy()` costs microseconds and a step asked for ten."""
        self.host = ((self.matrix.numpy(), self.written.numpy(), None if self.probs is None else self.probs.numpy())
                     if on_host(self.device) else None)

    def clear(self) -> None:
        """An empty matrix (in place: drafters sharing it see it emptied too)."""
        for t in (self.matrix, self.written, self.probs):
            if t is not None:
                t.zero_()
        if self.tables is not None:  # in place too: the tables are shared with the matrix
            for kept, made in zip(self.tables, coupling_tables(self.probs.numpy(), self.temperature)):
                kept[:] = made

    def share(self, other: "Recycling") -> None:
        """Draft from and learn into `other`'s matrix (one TR server's matrix for every request)."""
        self.matrix, self.written, self.probs = other.matrix, other.written, other.probs
        self.temperature, self.tables, self._table_views = other.temperature, other.tables, other._table_views
        self._keep_views()

    def couple(self, temperature: float) -> None:
        """Keep `coupling_tables` of every row beside the matrix from now on (host, with confidences):
        a coupled expansion then reads them instead of making them for every node of every step."""
        self.temperature = temperature
        self.tables = coupling_tables(self.probs.numpy(), temperature)
        self._table_views = tuple(torch.from_numpy(t) for t in self.tables)

    def expand(self, root: int, confidences: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the token of every template node, root first, on the device; with `confidences`, each
        node's stored probability, the root's 1). On a CPU our kernel walks the nodes in one call
        (decoding/tree_expansion.cpp), else numpy gathers over views of the matrix, a depth at a time:
        a dozen small torch indexing calls cost several times more there than the gathers."""
        probs = self.probs if confidences else None
        size = self.template.size
        if self.host is not None and on_host_now():  # the host views: a CPU, asked at construction
            if kernel_ready():
                parents, rank, _ = self.host_nodes
                tokens, conf = host_kernels().expand_template(self.matrix, probs, parents, rank, root)
                return tokens, None if probs is None else conf
            matrix, table = self.host[0], None if probs is None else self.host[2]
            tokens = np.empty(size, dtype=np.int64)
            conf = None if table is None else np.ones(size, dtype=np.float32)
            tokens[0] = root
            for idx, parent, rank in self.host_levels:
                src = tokens[parent]
                tokens[idx] = matrix[src, rank]
                if conf is not None:
                    conf[idx] = table[src, rank]
            return torch.from_numpy(tokens), None if conf is None else torch.from_numpy(conf)
        tokens = torch.empty(size, dtype=torch.long, device=self.device)
        conf = None if probs is None else torch.ones(size, dtype=torch.float32, device=self.device)
        tokens[:1].fill_(root)  # a scalar fill, so no host-to-device copy on an accelerator
        for idx, parent, rank in self.levels:
            src = tokens[parent]
            tokens[idx] = self.matrix[src, rank].long()
            if conf is not None:
                conf[idx] = probs[src, rank]
        return tokens, conf

    def expand_coupled(self, root: int, noise: KeyedNoise | list[np.ndarray],
                       temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """`expand` with confidences, siblings in the order of the target's draw (`coupled_expansion`;
        host only; in our kernel where it runs and the coupling tables are kept for this temperature).
        `noise`: per depth of the template its parents' noise, as rows or keyed (read entry by entry
        where the sampler samples through its table)."""
        tables = self.tables if self.temperature == temperature else None
        keyed = isinstance(noise, KeyedNoise)
        if tables is not None and kernel_ready():
            parents, rank, depth = self.host_nodes
            tables = self._table_views
            if keyed and noise.sampler.keyed():
                return host_kernels().expand_coupled_keyed(
                    self.matrix, self.probs, *tables, noise.sampler.key, list(noise.positions), gumbel_table()[0],
                    parents, rank, depth, root)
            rows = noise.rows(self.matrix.shape[0]) if keyed else noise
            return host_kernels().expand_coupled(
                self.matrix, self.probs, *tables, [torch.from_numpy(g) for g in rows], parents, rank, depth, root)
        rows = noise.rows(self.matrix.shape[0]) if keyed else noise
        tokens, conf = coupled_expansion(self.host[0], self.host[2], self.host_levels, root,
                                         rows, temperature, tables)
        return torch.from_numpy(tokens), torch.from_numpy(conf)

    # -- learning ----------------------------------------------------------------------------------
    def root_facts(self, roots, firsts):
        """Per root (a token, or a tensor of them): whether its matrix row was never written, and
        whether its rank-0 entry is the token the target chose after it (`firsts`); bool tensors on
        the device, or for one root on a CPU two bools."""
        if isinstance(roots, int) and self.host is not None:  # on the host, plain numbers: no tensor to make
            written = bool(self.host[1][roots])
            return not written, written and int(self.host[0][roots, 0]) == firsts
        written = self.written[roots]
        return ~written, (self.matrix[roots, 0] == firsts) & written

    def count(self, outcome: StepOutcome, nodes: tuple[int, ...] | None, root_unwritten, rank0_hit) -> None:
        """Per-node statistics of one step (the root's facts from `root_facts`, before the matrix
        learns from it). `nodes`: the template nodes drafted (a chooser's sub-tree, tr_fused's merged
        tree, whose ids past the template's are not the template's), None: the whole template."""
        n = len(self.template)
        accepted = outcome.accepted if nodes is None else [nodes[a - 1] for a in outcome.accepted]
        drafted = () if outcome.draft is None else None if nodes is None else tuple(v for v in nodes if v <= n)
        self.statistics.record([v for v in accepted if v <= n], drafted, root_unwritten, rank0_hit)

    def rows(self, outcome: StepOutcome, root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The matrix rows a step overwrites, (their tokens, their logits): every verified row
        (update=all_rows, the paper) or the accepted path's (update=accepted). `root`: the root's token
        as a 1-element tensor on the device."""
        draft = outcome.draft
        if draft is None:
            return root, outcome.logits[:1]
        tokens = torch.cat([root, draft.tokens.to(self.device)])
        if self.settings.update == "all_rows":
            return tokens, outcome.logits[: tokens.numel()]
        rows = to_device([0, *outcome.accepted], outcome.logits.device, torch.long)
        return tokens[rows.to(self.device)], outcome.logits[rows]

    def write(self, tokens: torch.Tensor, logits: torch.Tensor, duplicates: bool = True) -> None:
        """Rows `tokens` of the matrix <- the top-k of `logits` (one row each), and with confidences
        their probabilities; a token on several rows gets its last row's."""
        if on_host(self.device) and logits.device.type == "cpu":
            self._write_host(tokens.tolist(), logits)
        else:
            self.write_rows(tokens, logits, duplicates)

    def write_rows(self, tokens: torch.Tensor, logits: torch.Tensor, duplicates: bool = True) -> None:
        """`write` in tensor operations, as on an accelerator: duplicates resolved by `last_occurrence`
        (index_put_ leaves their order to the device)."""
        top = row_summary(logits, self.k, normaliser=self.probs is not None)
        last = last_occurrence(tokens) if duplicates else torch.arange(tokens.numel(), device=tokens.device)
        self.matrix[tokens] = top.indices[last].to(device=self.device, dtype=torch.int32)
        # a device value: `= True` copies a host scalar in and stalls the host (sync_audit.py)
        self.written[tokens] = torch.ones_like(tokens, dtype=torch.bool)
        if self.probs is not None:
            # softmax at the candidates only, no vocabulary-wide output
            self.probs[tokens] = probabilities(top)[last].to(self.device)

    def _write_host(self, tokens: list[int], logits: torch.Tensor) -> None:
        """`write` on the CPU: the rows written through numpy views, a handful of tensor calls a step
        instead of a dozen. A token on several rows keeps its last row's: the duplicates are dropped
        from the top-k's small results, not from the logits (copying the kept rows of a vocabulary-wide
        tensor cost more than the top-k itself, 2.3 ms a step for TR's 81 rows on SmolLM2)."""
        last = {t: i for i, t in enumerate(tokens)}
        keep = list(last.values()) if len(last) < len(tokens) else None
        top = row_summary(logits, self.k, normaliser=self.probs is not None)
        indices = top.indices if keep is None else top.indices[keep]
        tokens = np.fromiter(last, dtype=np.int64, count=len(last))  # each token once, in its last row's order
        matrix, written, kept = self.host
        matrix[tokens] = indices.numpy()
        written[tokens] = True
        if self.probs is not None:
            probs = probabilities(top)
            probs = (probs if keep is None else probs[keep]).numpy()
            kept[tokens] = probs
            if self.tables is not None:
                self._refresh_tables(tokens)

    def observe(self, outcome: StepOutcome, nodes: tuple[int, ...] | None = None, counted: bool = True) -> None:
        """Learn from one step: count it (unless not `counted`), then write its rows."""
        root, first = outcome.root, (outcome.emitted or [outcome.bonus])[0]
        if counted:
            self.count(outcome, nodes, *self.root_facts(root, first))  # the matrix before this step's writes
        if self.host is not None and outcome.logits.is_cpu:
            if self.settings.update == "all_rows" and outcome.logits.dtype == torch.float32 and kernel_ready():
                self._write_step(outcome)
            else:
                self._write_host(*self._host_rows(outcome))
            return
        self.write(*self.rows(outcome, torch.full((1,), root, dtype=torch.long, device=self.device)))

    def _write_step(self, outcome: StepOutcome) -> None:
        """`_write_host` of every verified row in one call of our kernel (decoding/row_summary.cpp's
        `write_rows`: the top k, the matrix, `written`, the probabilities and the coupling tables written
        there, a token on several rows keeping its last row's)."""
        draft = outcome.draft
        tables = self._table_views or (None, None)
        host_kernels().write_rows(outcome.logits, outcome.root, None if draft is None else draft.tokens,
                                  self.matrix, self.written, self.probs, *tables, self.temperature or 1.0)

    def _refresh_tables(self, tokens: np.ndarray) -> None:
        """The coupling tables of rows `tokens` (each once) from the probabilities just written there."""
        self.tables[0][tokens], self.tables[1][tokens] = coupling_tables(self.host[2][tokens], self.temperature)

    def _host_rows(self, outcome: StepOutcome) -> tuple[list[int], torch.Tensor]:
        """`rows` as a list of tokens, on the CPU."""
        draft = outcome.draft
        if draft is None:
            return [outcome.root], outcome.logits[:1]
        tokens = [outcome.root, *draft.tokens.tolist()]
        if self.settings.update == "all_rows":
            return tokens, outcome.logits[: len(tokens)]
        rows = [0, *outcome.accepted]
        return [tokens[i] for i in rows], outcome.logits[rows]

    def observe_prompt(self, prompt: torch.Tensor, logits: torch.Tensor) -> None:
        """prefill_update: a row for every prompt token; a token seen twice keeps its last row."""
        last = {t: i for i, t in enumerate(prompt.tolist())}
        at = to_device(list(last.values()), logits.device, torch.long)
        self.write(to_device(list(last), self.device, torch.long), logits[at], duplicates=False)


def observe_batch(sources: list[Recycling], outcomes: list[StepOutcome], nodes: list, counted: list[bool]) -> None:
    """One step of several requests: count each, then write every verified row of the requests that
    share a matrix with one top-k and one write. Request by request, each would pay its own handful of
    small tensor operations, and a batch that decodes plainly would pay them B times a step for one
    row each. A token two requests write keeps the later request's row, as if they observed in turn."""
    shared: dict[int, list[int]] = {}
    for i, s in enumerate(sources):
        shared.setdefault(id(s.matrix), []).append(i)
    for members in shared.values():
        owner = sources[members[0]]
        if len(members) == 1:
            owner.observe(outcomes[members[0]], nodes[members[0]], counted[members[0]])
            continue
        outs = [outcomes[i] for i in members]
        roots, firsts = to_device([[o.root for o in outs], [(o.emitted or [o.bonus])[0] for o in outs]],
                                  owner.device, torch.long)
        unwritten, rank0_hits = owner.root_facts(roots, firsts)  # the matrix before this step's writes
        tokens, logits = [], []
        for j, (i, o) in enumerate(zip(members, outs)):
            if counted[i]:
                sources[i].count(o, nodes[i], unwritten[j], rank0_hits[j])
            t, rows = sources[i].rows(o, roots[j : j + 1])
            tokens.append(t)
            logits.append(rows)
        owner.write(torch.cat(tokens), torch.cat(logits))

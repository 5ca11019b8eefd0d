"""Lookahead Decoding (Fu et al., arXiv 2402.02057; hao-ai-lab/LookaheadDecoding), on the core engine.

One forward pass per step carries two branches that never see each other:

* the lookahead branch, a Jacobi window of `levels` x `cols` cells. Cell (0, 0) is the root (the
  last decided token, row 0 of the forward); every other cell is an extra (non-candidate) row of the
  Draft. Cell (l, c) sits at position offset c + l from the root. Level 0 is causal among itself;
  cell (l, c), l >= 1, sees level-0 columns <= c and column c of levels 1..l. Its positions are
  therefore contiguous: root .. root + c + l.
* the verification branch: up to G (N-1)-grams from the pool keyed by the root, as tree nodes (each
  row sees the prefix, the root and its own earlier tokens).

The window starts as one level of W + N - 2 columns (root + W + N - 3 tokens copied at random from
the prompt) and grows one level per step while dropping a column, until it holds N - 1 levels of W
columns (the published warm-up). From then on, every step adds one n-gram per column to the pool
(cell tokens down the column plus the top level's prediction) and slides the levels down by one.

The pool maps a first token to at most G (N-1)-grams, least recently inserted first (LRU). It is
reset before every question unless `keep_pool`; with `prompt_ngrams` it is seeded from the prompt's
n-grams and fed every n-gram of the output as it is produced (the original's POOL_FROM_PROMPT).

Candidates sharing a prefix are merged into a trie (`merge_candidates`, default): the deepest
accepted path of the trie is exactly the longest matching row of the original's flat verification,
with fewer rows. With flat rows the engine follows the first sibling whose token matches (as every
tree verifier here does), so a later row with the same first token but a longer match is lost.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from functools import lru_cache

import torch

from specbench.drafter import DecodeState, Draft, Drafter, StepOutcome
from specbench.registry import register
from specbench.tree import DraftTree


@lru_cache(maxsize=64)
def window_layout(levels: int, cols: int) -> tuple[tuple[tuple[int, int], ...], torch.Tensor, torch.Tensor]:
    """The window's extra rows for `levels` x `cols` cells, cell (0, 0) being the root.

    Returns (cells in row order, position offsets, visibility), where visibility is a bool matrix
    (n_extra, 1 + n_extra) over [root] + extra rows. Rows: level 0 columns 1.., then each higher
    level's columns 0.., level by level.
    """
    if levels < 1 or cols < 1:
        raise ValueError(f"a lookahead window needs at least one level and one column, got {levels} x {cols}")
    cells = [(0, c) for c in range(1, cols)] + [(l, c) for l in range(1, levels) for c in range(cols)]
    index = {(0, 0): 0}
    for i, cell in enumerate(cells, start=1):
        index[cell] = i
    vis = torch.zeros(len(cells), len(cells) + 1, dtype=torch.bool)
    for i, (l, c) in enumerate(cells):
        for c2 in range(c + 1):
            vis[i, index[(0, c2)]] = True
        for l2 in range(1, l + 1):
            vis[i, index[(l2, c)]] = True
    depths = torch.tensor([c + l for l, c in cells], dtype=torch.long)
    return tuple(cells), depths, vis


def candidate_tree(guesses: list[tuple[int, ...]], merge: bool) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the verification branch: a trie of the guesses, or one chain per guess."""
    tokens: list[int] = []
    parents: list[int] = []
    if merge:
        node_of: dict[tuple[int, int], int] = {}
        for g in guesses:
            node = 0
            for tok in g:
                key = (node, tok)
                if key not in node_of:
                    tokens.append(tok)
                    parents.append(node)
                    node_of[key] = len(tokens)
                node = node_of[key]
    else:
        for g in guesses:
            node = 0
            for tok in g:
                tokens.append(tok)
                parents.append(node)
                node = len(tokens)
    return tokens, parents


class NgramPool:
    """First token -> at most `size` (N-1)-grams, oldest first; re-inserting one makes it newest."""

    def __init__(self, size: int):
        self.size = size
        self.table: dict[int, OrderedDict] = {}

    def add(self, key: int, gram: tuple[int, ...]) -> None:
        if self.size <= 0:
            return
        grams = self.table.get(key)
        if grams is None:
            grams = self.table[key] = OrderedDict()
        if gram in grams:
            grams.move_to_end(gram)
            return
        if len(grams) >= self.size:
            grams.popitem(last=False)
        grams[gram] = None

    def get(self, key: int) -> list[tuple[int, ...]]:
        grams = self.table.get(key)
        return list(grams) if grams else []

    def clear(self) -> None:
        self.table.clear()

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())


@register("lookahead")
class Lookahead(Drafter):
    def __init__(self, vocab_size: int = 0, N: int = 5, W: int = 7, G: int = 7, merge_candidates: bool = True,
                 keep_pool: bool = False, prompt_ngrams: bool = False, seed: int = 0,
                 device: str | torch.device = "cpu", **_):
        N, W, G = int(N), int(W), int(G)
        if N < 2:
            raise ValueError(f"Lookahead needs N >= 2 (n-gram size), got N={N}")
        if W < 1:
            raise ValueError(f"Lookahead needs a window of W >= 1 columns, got W={W}")
        if G < 0:
            raise ValueError(f"Lookahead needs G >= 0 (n-grams kept per key and verified per step), got G={G}")
        self.N, self.W, self.G = N, W, G
        self.merge_candidates = bool(merge_candidates)
        self.keep_pool = bool(keep_pool)
        self.prompt_ngrams = bool(prompt_ngrams)
        self.seed = int(seed)
        self.pool = NgramPool(G)
        self.levels: list[list[int]] | None = None  # levels[l][c]; levels[0][0] = the root
        self._fed = 0  # tokens of the sequence already fed to the pool (prompt_ngrams)
        self._last: tuple[int, int, int] | None = None  # (levels, cols, tree nodes) of the last draft
        self.stats = {"steps": 0, "candidate_rows": 0, "placeholder_steps": 0, "window_rows": 0}

    # -- state ---------------------------------------------------------------------------------
    def start_question(self) -> None:
        if not self.keep_pool:
            self.pool.clear()
        self.levels = None

    def _start_turn(self, state: DecodeState) -> None:
        prompt = state.tokens[: state.prompt_len].tolist() or state.tokens.tolist()
        rng = random.Random(self.seed)
        cols = self.W + self.N - 2  # root + W + N - 3 tokens, as the original's warm-up starts
        self.levels = [[0] + [rng.choice(prompt) for _ in range(cols - 1)]]
        self._fed = 0

    def _feed_sequence(self, seq: list[int]) -> None:
        """Every N-gram of the sequence not fed yet goes into the pool (key = its first token)."""
        n = self.N
        for s in range(max(0, self._fed - n + 1), len(seq) - n + 1):
            self.pool.add(seq[s], tuple(seq[s + 1 : s + n]))
        self._fed = len(seq)

    # -- drafting ------------------------------------------------------------------------------
    def propose(self, state: DecodeState) -> Draft:
        if state.step == 0 or self.levels is None:
            self._start_turn(state)
        root = int(state.tokens[-1])
        if self.prompt_ngrams:
            self._feed_sequence(state.tokens.tolist())
        self.levels[0][0] = root
        levels, cols = len(self.levels), len(self.levels[0])

        tokens, parents = candidate_tree(self.pool.get(root), self.merge_candidates)
        if not tokens:
            # The engine runs a draft only when its tree has a node, so with no candidate the window
            # needs a stand-in: the window's own guess for the next position (any token is lossless).
            tokens, parents = [self.levels[1][0] if levels > 1 else self.levels[0][1 % cols]], [0]
            self.stats["placeholder_steps"] += 1
        tree = DraftTree(parents)

        cells, depths, vis = window_layout(levels, cols)
        n_extra = len(cells)
        extra_vis = torch.zeros(n_extra, tree.size + n_extra, dtype=torch.bool)
        extra_vis[:, 0] = vis[:, 0]
        extra_vis[:, tree.size :] = vis[:, 1:]
        extra_tokens = torch.tensor([self.levels[l][c] for l, c in cells], dtype=torch.long)
        self._last = (levels, cols, len(tree))
        self.stats["steps"] += 1
        self.stats["candidate_rows"] += len(tree)
        self.stats["window_rows"] += n_extra
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long), tree=tree, extra_tokens=extra_tokens,
                     extra_depths=depths, extra_visibility=extra_vis)

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.draft is None or self._last is None or self.levels is None:
            return
        levels, cols, n_tree = self._last
        self._last = None
        top = levels - 1
        # Rows of the top level's cells in the forward: root = 0, extras after the tree's nodes.
        first_extra = 1 + n_tree
        if top == 0:
            rows = [0] + [first_extra + c - 1 for c in range(1, cols)]
        else:
            start = first_extra + (cols - 1) + (top - 1) * cols
            rows = list(range(start, start + cols))
        preds = outcome.logits[rows].argmax(dim=-1).tolist()

        if levels < self.N - 1:  # warm-up: a new level from the top level's predictions
            self.levels = [lv[1:] for lv in self.levels] + [preds[1:]]
        else:  # full window: one n-gram per column, then slide the levels down
            for c in range(cols):
                gram = tuple(self.levels[l][c] for l in range(1, levels)) + (preds[c],)
                self.pool.add(self.levels[0][c], gram)
            self.levels = self.levels[1:] + [preds]
        # levels[0][0] becomes the next root in propose()

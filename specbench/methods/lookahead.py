"""Lookahead Decoding (Fu et al., arXiv 2402.02057; hao-ai-lab/LookaheadDecoding), on the core engine.

One forward per step carries two branches that never see each other: the lookahead branch, a Jacobi
window of `levels` x `cols` cells sent as extra rows (never candidates), whose columns feed an n-gram
pool; and the verification branch, the pool's (N-1)-grams for the root as draft-tree nodes (a trie
by default, `merge_candidates`). Lossless: no tree row sees a window cell, the engine drops the extra
rows from the KV cache, and every candidate goes through the engine's verifier. `pool` sets the
pool's lifetime (turn, question, run); `prompt_ngrams` seeds it from the prompt.
docs/lookahead.md describes the window and the pool, where this departs from the original (one
level per step, a stand-in candidate when the pool is empty, the pool used during warm-up) and what
those choices measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import random
from collections import OrderedDict
from functools import lru_cache

import torch

from specbench.draft import DecodeState, Draft, StepOutcome
from specbench.drafter import Drafter
from specbench.errors import SettingsError
from specbench.registry import register
from specbench.draft import DraftTree


@lru_cache(maxsize=64)
def window_layout(levels: int, cols: int) -> tuple[tuple[tuple[int, int], ...], torch.Tensor, torch.Tensor]:
    """The window's extra rows for `levels` x `cols` cells, cell (0, 0) being the root.

    Returns (cells in row order, position offsets, visibility), where visibility is a bool matrix
    (n_extra, 1 + n_extra) over [root] + extra rows. Row order: level 0 columns 1.., then each
    higher level's columns 0.., level by level.
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


def top_level_rows(levels: int, cols: int, n_tree: int) -> list[int]:
    """Forward rows of the top level's cells, column by column, for a draft of n_tree tree nodes.

    The forward's rows are the root, the tree nodes, then the extra rows in `window_layout` order.
    """
    top = levels - 1
    if top == 0:
        return [0] + [n_tree + c for c in range(1, cols)]
    start = n_tree + cols + (top - 1) * cols  # after the root, the tree, level 0 and levels 1..top-1
    return list(range(start, start + cols))


@lru_cache(maxsize=1024)
def tree_of(parents: tuple[int, ...]) -> DraftTree:
    """One DraftTree per shape, so its masks (and the engine's per-tree tensors) are built once."""
    return DraftTree(parents)


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


POOL_LIFETIMES = ("turn", "question", "run")


@dataclass
class LookaheadSettings:
    """Spec-Bench's settings N=5, W=7, G=7."""

    N: int = 5  # n-gram size; the Jacobi window has N-1 levels
    W: int = 7  # window columns (level 0's first column is the root)
    G: int = 7  # n-grams kept per first token in the pool (LRU) = most candidates per step
    merge_candidates: bool = True  # candidates sharing a prefix become one trie; false: one flat chain each
    pool: str = "turn"  # n-gram pool lifetime: turn (Spec-Bench: a new pool per generate call) | question | run
    prompt_ngrams: bool = False  # true: seed the pool with the prompt's n-grams and add the output's as it grows
    seed: int = 0  # random choice of prompt tokens that fill the initial window

    def __post_init__(self):
        if self.N < 2:
            raise SettingsError(f"Lookahead needs method.N >= 2 (n-gram size), got N={self.N}")
        if self.W < 1:
            raise SettingsError(f"Lookahead needs a window of method.W >= 1 columns, got W={self.W}")
        if self.G < 0:
            raise SettingsError(f"Lookahead needs method.G >= 0 (n-grams kept per key and verified per step), "
                                f"got G={self.G}")
        if self.pool not in POOL_LIFETIMES:
            raise SettingsError(f"Lookahead: method.pool must be one of {', '.join(POOL_LIFETIMES)}, "
                                f"got '{self.pool}'")


@register("lookahead")
class Lookahead(Drafter):
    Settings = LookaheadSettings

    def __init__(self, target=None, settings: LookaheadSettings | None = None, **values):
        super().__init__(target, settings, **values)
        self.pool = NgramPool(self.settings.G)
        self.reset()

    # -- state ---------------------------------------------------------------------------------
    def reset(self) -> None:
        self.pool.clear()
        self.levels: list[list[int]] | None = None  # levels[l][c]; levels[0][0] = the root
        self._fed = 0  # tokens of the sequence already fed to the pool (prompt_ngrams)
        self._pending: tuple[int, int, int, bool] | None = None  # (levels, cols, tree nodes, stand-in)
        self.stats = {"steps": 0, "candidate_rows": 0, "window_rows": 0, "stand_in_steps": 0,
                      "stand_in_accepted": 0}

    def start_question(self) -> None:
        if self.settings.pool != "run":
            self.pool.clear()
        self.levels = None

    def _start_turn(self, state: DecodeState) -> None:
        if self.settings.pool == "turn":
            self.pool.clear()
        prompt = state.tokens[: state.prompt_len].tolist() or state.tokens.tolist()
        rng = random.Random(self.settings.seed)
        cols = self.settings.W + self.settings.N - 2  # root + W + N - 3 prompt tokens, as the original's warm-up starts
        self.levels = [[0] + [rng.choice(prompt) for _ in range(cols - 1)]]
        self._fed = 0
        self._pending = None

    def _feed_sequence(self, tokens: torch.Tensor) -> None:
        """Every N-gram of the sequence not fed yet goes into the pool (key = its first token)."""
        n = self.settings.N
        start = max(0, self._fed - n + 1)
        seq = tokens[start:].tolist()
        for s in range(len(seq) - n + 1):
            self.pool.add(seq[s], tuple(seq[s + 1 : s + n]))
        self._fed = tokens.numel()

    # -- drafting ------------------------------------------------------------------------------
    def propose(self, state: DecodeState) -> Draft:
        if state.step == 0 or self.levels is None:
            self._start_turn(state)
        root = int(state.tokens[-1])
        if self.settings.prompt_ngrams:
            self._feed_sequence(state.tokens)
        self.levels[0][0] = root
        levels, cols = len(self.levels), len(self.levels[0])

        tokens, parents = candidate_tree(self.pool.get(root), self.settings.merge_candidates)
        stand_in = not tokens
        if stand_in:  # see the module docstring: the window's guess for the next position
            tokens, parents = [self.levels[1][0] if levels > 1 else self.levels[0][1 % cols]], [0]
            self.stats["stand_in_steps"] += 1
        tree = tree_of(tuple(parents))

        cells, depths, vis = window_layout(levels, cols)
        n_extra = len(cells)
        extra_vis = torch.zeros(n_extra, tree.size + n_extra, dtype=torch.bool)
        extra_vis[:, 0] = vis[:, 0]  # the root; never a tree node
        extra_vis[:, tree.size :] = vis[:, 1:]
        extra_tokens = torch.tensor([self.levels[l][c] for l, c in cells], dtype=torch.long)
        self._pending = (levels, cols, len(tree), stand_in)
        self.stats["steps"] += 1
        self.stats["candidate_rows"] += len(tree)
        self.stats["window_rows"] += n_extra
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long), tree=tree, extra_tokens=extra_tokens,
                     extra_depths=depths, extra_visibility=extra_vis)

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.draft is None or self._pending is None or self.levels is None:
            return
        levels, cols, n_tree, stand_in = self._pending
        self._pending = None
        if stand_in and outcome.accepted:
            self.stats["stand_in_accepted"] += 1
        preds = outcome.logits[top_level_rows(levels, cols, n_tree)].argmax(dim=-1).tolist()

        if levels < self.settings.N - 1:  # warm-up: one level more, one column less
            self.levels = [lv[1:] for lv in self.levels] + [preds[1:]]
        else:  # full window: one n-gram per column, then every level moves down one
            for c in range(cols):
                gram = tuple(self.levels[l][c] for l in range(1, levels)) + (preds[c],)
                self.pool.add(self.levels[0][c], gram)
            self.levels = self.levels[1:] + [preds]
        # levels[0][0] (a stale guess now) becomes the next root in propose()

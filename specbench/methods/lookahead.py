"""Lookahead Decoding (Fu et al., arXiv 2402.02057; hao-ai-lab/LookaheadDecoding), on the core engine.

One forward pass per step carries two branches that never see each other:

* the lookahead branch, a Jacobi window of `levels` x `cols` cells. Cell (0, 0) is the root (the
  last decided token, row 0 of the forward); every other cell is an extra (non-candidate) row of the
  Draft, never accepted. Cell (l, c) sits at position offset l + c from the root (the original's
  position ids). Level 0 is causal among itself; cell (l, c), l >= 1, sees level-0 columns <= c and
  column c of levels 1..l, so every cell sees a contiguous run of positions, root .. root + l + c.
* the verification branch: the (N-1)-grams the pool holds for the root, as draft-tree nodes (each
  sees the cached prefix, the root and its own earlier tokens; never a window cell).

Window. It starts as one level of W + N - 2 columns: the root and W + N - 3 tokens drawn at random
from the prompt (seeded). Warm-up (N - 2 steps): the top level's predictions (argmax of its rows'
logits) minus the first become a new level, and every level drops its first column, so the window
grows a level and loses a column per step until it holds N - 1 levels of W columns. Then, every
step: for each column c, the n-gram (level 0..N-2 of column c, then the top cell's prediction) goes
into the pool keyed by its level-0 token (the root for column 0); level 0 is dropped, each level
moves down one, the top level's predictions become the new top level, and the new root replaces
cell (0, 0). Every cell thus keeps offset l + c as the root advances by one.

Several tokens accepted in one step: the window still moves one level, as the original's greedy
path does (it asserts ALWAYS_FWD_ONE); the window is a guess generator, so its cells' positions only
need to be consistent within the forward pass, which they are. The alternative the original offers
only to its sampling path (ALWAYS_FWD_ONE=0: drop as many extra columns as tokens accepted so each
cell keeps its absolute target position, refill the right edge with random prompt tokens) was
measured here and is worse: MAT 1.535 against 1.661 for one-level moves (SmolLM2-135M-Instruct,
greedy, the first question of each of the 6 Spec-Bench subtasks, 128 new tokens, 666 tokens in all);
the refilled columns feed the pool junk n-grams for N - 2 steps.

Pool: a first token maps to at most G (N-1)-grams, least recently inserted first; inserting one that
is already there makes it the newest, and the oldest is evicted beyond G (the original's LRU).
Pool lifetime (`pool`): `turn` (default) empties it before every turn, as Spec-Bench does (it builds
a fresh pool on every generate call, so MT-bench's turn 2 starts empty too); `question` keeps it
across the turns of a question; `run` keeps it across questions. With `prompt_ngrams` the
pool is seeded with the prompt's N-grams and fed each N-gram of the output as it is decided (the
original's POOL_FROM_PROMPT).

Verification branch (`merge_candidates`). Merged (default): the pool's n-grams for the root form a
trie, so shared prefixes are verified once; the deepest accepted path of the trie is exactly the
longest matching row of the original's flat verification, with fewer rows. Flat: one chain per
n-gram, the original's layout; the engine's verifier follows the first sibling whose token matches,
so a later row with the same first tokens but a longer match is lost: in any one step flat rows
accept no more than the trie. Over a run the window and pool then evolve differently, so a single
question can go either way. Measured (greedy, 128 new tokens): on the 6 questions above (666
tokens) merged MAT 1.661 with 36.0 rows per step, flat 1.632 with 37.4; on `task=spec_bench
task.per_subtask=2` (12 questions, 14 turns, 1429 tokens) merged 1.728 with 36.4 rows per step,
flat 1.673 with 37.8; both 12/12 equal to AR.

Stand-in candidate. The engine skips a draft whose tree has no node, which would stall the window
on every step where the pool has nothing for the root. Such a step therefore verifies one stand-in
node, the window's own guess for the next position (cell (1, 0), Jacobi decoding's guess). The
original verifies nothing there; the stand-in is sometimes accepted (`stats["stand_in_accepted"]`),
so MAT here is slightly above what the original would get: on the 6 questions above, 183 of 401
steps had a stand-in and 7 of them accepted it (7 of the 666 tokens).

Lossless: window cells are extra rows (never candidates, never seen by tree rows; the engine
verifies tree rows only and drops the extra rows from the KV cache), and every candidate is checked
by the engine's verifier, greedy or position-keyed sampling alike. The window's predictions are
argmax guesses at any temperature, as in the original.

Spec-Bench's vendored copy of the original counts a fully matched row one token short (its match
loop cannot reach N - 1), so its published Lookahead MAT is slightly below the algorithm's.

Other departures from the original: the verification branch is used during warm-up too (the pool
may already hold n-grams with `pool=question|run` or `prompt_ngrams`); N = 2 (a one-level window: plain
Jacobi guesses feeding 1-grams) works.
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


@register("lookahead")
class Lookahead(Drafter):
    Settings = LookaheadSettings

    def __init__(self, target=None, settings: LookaheadSettings | None = None, **values):
        super().__init__(target, settings, **values)
        s = self.settings
        N, W, G = int(s.N), int(s.W), int(s.G)
        merge_candidates, pool, prompt_ngrams, seed = s.merge_candidates, s.pool, s.prompt_ngrams, s.seed
        self._check(N, W, G, pool)
        self.N, self.W, self.G = N, W, G
        self.merge_candidates = bool(merge_candidates)
        self.pool_lifetime = pool
        self.prompt_ngrams = bool(prompt_ngrams)
        self.seed = int(seed)
        self.pool = NgramPool(G)
        self.reset()

    # -- state ---------------------------------------------------------------------------------
    def reset(self) -> None:
        self.pool.clear()
        self.levels: list[list[int]] | None = None  # levels[l][c]; levels[0][0] = the root
        self._fed = 0  # tokens of the sequence already fed to the pool (prompt_ngrams)
        self._pending: tuple[int, int, int, bool] | None = None  # (levels, cols, tree nodes, stand-in)
        self.stats = {"steps": 0, "candidate_rows": 0, "window_rows": 0, "stand_in_steps": 0,
                      "stand_in_accepted": 0}

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        p = super().check_settings(params, target)
        cls._check(p["N"], p["W"], p["G"], p["pool"])
        return p

    @staticmethod
    def _check(N: int, W: int, G: int, pool: str) -> None:
        if N < 2:
            raise SettingsError(f"Lookahead needs method.N >= 2 (n-gram size), got N={N}")
        if W < 1:
            raise SettingsError(f"Lookahead needs a window of method.W >= 1 columns, got W={W}")
        if G < 0:
            raise SettingsError(f"Lookahead needs method.G >= 0 (n-grams kept per key and verified per step), "
                                f"got G={G}")
        if pool not in POOL_LIFETIMES:
            raise SettingsError(f"Lookahead: method.pool must be one of {', '.join(POOL_LIFETIMES)}, got '{pool}'")

    def start_question(self) -> None:
        if self.pool_lifetime != "run":
            self.pool.clear()
        self.levels = None

    def _start_turn(self, state: DecodeState) -> None:
        if self.pool_lifetime == "turn":
            self.pool.clear()
        prompt = state.tokens[: state.prompt_len].tolist() or state.tokens.tolist()
        rng = random.Random(self.seed)
        cols = self.W + self.N - 2  # root + W + N - 3 prompt tokens, as the original's warm-up starts
        self.levels = [[0] + [rng.choice(prompt) for _ in range(cols - 1)]]
        self._fed = 0
        self._pending = None

    def _feed_sequence(self, tokens: torch.Tensor) -> None:
        """Every N-gram of the sequence not fed yet goes into the pool (key = its first token)."""
        n = self.N
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
        if self.prompt_ngrams:
            self._feed_sequence(state.tokens)
        self.levels[0][0] = root
        levels, cols = len(self.levels), len(self.levels[0])

        tokens, parents = candidate_tree(self.pool.get(root), self.merge_candidates)
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

        if levels < self.N - 1:  # warm-up: one level more, one column less
            self.levels = [lv[1:] for lv in self.levels] + [preds[1:]]
        else:  # full window: one n-gram per column, then every level moves down one
            for c in range(cols):
                gram = tuple(self.levels[l][c] for l in range(1, levels)) + (preds[c],)
                self.pool.add(self.levels[0][c], gram)
            self.levels = self.levels[1:] + [preds]
        # levels[0][0] (a stale guess now) becomes the next root in propose()

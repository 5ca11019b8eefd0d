"""Acceptance: which path of the draft tree the target model agrees with.

`accept_path` is the rule in plain Python, and `walk_path` the same walk choosing each row's target only
when it reaches that row (a CPU's verification); `accepted_path` computes the same on the model's
device from a tree's precomputed index tensors (`TreeTensors`) and every row's target, so a step needs
one small copy back.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from specbench.decoding.transfers import on_host, stacked_to_device
from specbench.draft import DraftTree


def row_argmax(scores: torch.Tensor) -> torch.Tensor:
    """`scores.argmax(dim=-1)`, the same indices (the first maximum; the first NaN, as torch). On a CPU,
    float32 rows go through numpy, whose argmax is several times faster than torch's there (the
    results log, 2026-11-27 evening); every verified row pays it, AR's included."""
    if on_host(scores.device) and scores.dtype in (torch.float32, torch.float64) and scores.dim() >= 1:
        return torch.from_numpy(np.asarray(scores.numpy().argmax(axis=-1), dtype=np.int64))
    return scores.argmax(dim=-1)


def accept_path(tree: DraftTree, draft_tokens: list[int], targets: list[int]) -> tuple[list[int], int]:
    """Longest root-to-node path whose every token equals the target's choice at its parent.

    `targets[i]` is the target's token at row i (row 0 = root): the argmax in greedy decoding, the
    position-keyed sample otherwise. Returns (accepted nodes in path order, bonus token), where the
    bonus is the target's token after the last accepted node. Siblings may repeat a token; the
    first one wins, which is harmless since they carry the same prefix.
    """
    accepted, reached = walk_path(tree, draft_tokens, targets.__getitem__)
    return accepted, reached[-1]


def walk_path(tree: DraftTree, draft_tokens: list[int], target_at: Callable[[int], int]) -> tuple[list[int], list[int]]:
    """`accept_path` asking for a row's target only when the walk reaches that row: the root's, then
    each accepted node's. Returns (accepted nodes in path order, the targets at the root and at each
    accepted node; the last is the bonus). On a CPU a row's target is a pass over the vocabulary of its
    own (an argmax, or a sample), and the rows off the path are never needed."""
    accepted: list[int] = []
    reached: list[int] = []
    node = 0
    while True:
        want = target_at(node)
        reached.append(want)
        for child in tree.children[node]:
            if draft_tokens[child - 1] == want:
                accepted.append(child)
                node = child
                break
        else:
            return accepted, reached


class TreeTensors:
    """A draft tree's index tensors on the model's device, made once per tree (drafters reuse trees)
    and brought there in one queued copy (REST and Lookahead make a new tree every step)."""

    def __init__(self, tree: DraftTree, device: torch.device | str):
        n = len(tree)
        parents = torch.tensor(tree.parents, dtype=torch.long).reshape(n)
        # earlier_sibling[i, j]: node j+1 is an earlier child of node i+1's parent (the verifier
        # follows the first matching sibling)
        earlier = (parents[:, None] == parents[None, :]) & torch.ones(n, n, dtype=torch.bool).tril(-1)
        # at_depth[d, i]: node i sits at depth d; picks the accepted node of each depth
        at_depth = tree.depths[None, :] == torch.arange(tree.max_depth + 1)[:, None]
        node_ids = torch.arange(tree.size)
        (self.depths, self.ancestors, self.parents, self.earlier_sibling, self.at_depth,
         self.node_ids) = stacked_to_device([tree.depths, tree.ancestor_mask, parents, earlier, at_depth, node_ids],
                                            device)


def accepted_path(tt: TreeTensors, draft_tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`accept_path` on the device: the accepted node at each depth (0 past the path's end).

    A node is accepted when its token is its parent's target, no earlier sibling's is, and the same
    holds for all its ancestors. Returns a (max_depth + 1,) tensor whose entry 0 is the root; the
    accepted length is the number of non-zero entries after it."""
    match = draft_tokens == targets[tt.parents]
    first = match & ~(tt.earlier_sibling & match[None, :]).any(dim=1)
    ok = torch.cat([first.new_ones(1), first])  # the root is always on the path
    on_path = ~(tt.ancestors & ~ok[None, :]).any(dim=1)
    return (tt.at_depth & on_path[None, :]).long().mul(tt.node_ids).amax(dim=1)

"""Acceptance: which path of the draft tree the target model agrees with."""

from __future__ import annotations

from specbench.tree import DraftTree


def accept_path(tree: DraftTree, draft_tokens: list[int], targets: list[int]) -> tuple[list[int], int]:
    """Longest root-to-node path whose every token equals the target's choice at its parent.

    `targets[i]` is the target's token at row i (row 0 = root): the argmax in greedy decoding, the
    position-keyed sample otherwise. Returns (accepted nodes in path order, bonus token), where the
    bonus is the target's token after the last accepted node. Siblings may repeat a token; the
    first one wins, which is harmless since they carry the same prefix.
    """
    accepted: list[int] = []
    node = 0
    while True:
        want = targets[node]
        for child in tree.children[node]:
            if draft_tokens[child - 1] == want:
                accepted.append(child)
                node = child
                break
        else:
            return accepted, want

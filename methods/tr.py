"""Token Recycling (arXiv 2408.08696): draft from an adjacency matrix of recycled top-k tokens.

After every verification forward, the top-k tokens the model predicted at each row overwrite the
matrix row of that row's token. Drafting expands a static tree template from the root: the r-th
child of a node is rank r of its token's row. The matrix survives across questions (hot start).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specbench.drafter import DecodeState, Draft, Drafter, StepOutcome
from specbench.registry import register
from specbench.tree import DraftTree

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
    if isinstance(tree, (str, Path)):
        path = Path(tree)
        if not path.is_file():
            raise FileNotFoundError(
                f"tree template file '{tree}' not found; give method.tree=published, a JSON file path, "
                f"or an inline list of child counts per depth"
            )
        data = json.loads(path.read_text())
        return data["children"] if isinstance(data, dict) else data
    return [list(map(int, level)) for level in tree]


@register("tr")
class TokenRecycling(Drafter):
    def __init__(self, vocab_size: int, k: int = 8, tree="published", cold_start: bool = False,
                 device: str | torch.device = "cpu", **_):
        if k < 1:
            raise ValueError(f"Token Recycling needs k >= 1 candidates per matrix row, got k={k}")
        self.k = k
        self.cold_start = cold_start
        self.tree = DraftTree.from_children_counts(load_tree_template(tree))
        ranks = self.tree.sibling_rank()
        if max(ranks) >= k:
            raise ValueError(
                f"the tree template gives a node {max(ranks) + 1} children but the matrix keeps only "
                f"k={k} tokens per row; raise method.k or trim the template"
            )
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

    def start_question(self) -> None:
        if self.cold_start:
            self.matrix.zero_()

    def propose(self, state: DecodeState) -> Draft:
        tokens = torch.empty(self.tree.size, dtype=torch.long, device=self.device)
        tokens[0] = state.tokens[-1]
        for idx, parent, rank in self._levels:
            tokens[idx] = self.matrix[tokens[parent], rank].long()
        return Draft(tokens=tokens[1:], tree=self.tree)

    def observe(self, outcome: StepOutcome) -> None:
        draft = outcome.draft
        rows = 1 if draft is None else draft.tree.size
        row_tokens = torch.tensor([outcome.root], device=self.device)
        if draft is not None:
            row_tokens = torch.cat([row_tokens, draft.tokens.to(self.device)])
        top = outcome.logits[:rows].topk(self.k, dim=-1).indices
        self.matrix[row_tokens] = top.to(device=self.device, dtype=torch.int32)

"""Where in Token Recycling's tree acceptance happens, and how full the matrix is: the counts behind
per-node acceptance plots and scripts/tune_tree.py.

Counted per verification step: which template nodes were drafted and which were on the accepted
path, whether the root's matrix row had ever been written, and whether its rank-0 entry was the
token the target chose. The two matrix counts stay on the drafter's device until the question ends,
so counting adds no device-to-host copy per step.
"""

from __future__ import annotations

from collections import Counter

import torch

from specbench.decoding.tree import DraftTree
from specbench.methods.tree_tuning import children_counts_of, rank_paths


class RecyclingStatistics:
    def __init__(self, template: DraftTree, device: torch.device):
        self.template = template
        self.device = device
        self._tree = children_counts_of(rank_paths(template))  # the published form of the template
        self.clear()

    def clear(self) -> None:
        """Forget every count (no device read, so it is safe at construction on any device)."""
        n = len(self.template)
        self.steps = 0
        self.hits = [0] * n
        self.drafted: Counter = Counter()  # template node sets (None: the whole template) -> steps
        self.unwritten = torch.zeros((), dtype=torch.long, device=self.device)
        self.rank0 = torch.zeros((), dtype=torch.long, device=self.device)

    def record(self, accepted: list[int], drafted: tuple[int, ...] | None, root_written: torch.Tensor,
               rank0_hit: torch.Tensor) -> None:
        """One step: accepted template nodes, the drafted template nodes (None: all; () a plain
        step), and two 0-d bool tensors about the root's row."""
        self.steps += 1
        for v in accepted:
            self.hits[v - 1] += 1
        self.drafted[drafted] += 1
        self.unwritten += ~root_written
        self.rank0 += rank0_hit & root_written

    def take(self) -> dict:
        n = len(self.template)
        drafted = [0] * n
        for nodes, count in self.drafted.items():
            for v in range(1, n + 1) if nodes is None else nodes:
                drafted[v - 1] += count
        depths = self.template.depths.tolist()[1:]
        depth_hits = [0] * self.template.max_depth
        for v, h in enumerate(self.hits):
            depth_hits[depths[v] - 1] += h
        out = {"tree": self._tree, "steps": self.steps, "node_hits": list(self.hits), "node_drafted": drafted,
               "depth_hits": depth_hits, "root_row_unwritten": int(self.unwritten),
               "root_rank0_hits": int(self.rank0)}
        self.clear()
        return out


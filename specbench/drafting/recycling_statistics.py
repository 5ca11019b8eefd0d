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

from specbench.draft import DraftTree
from specbench.drafting.template_tuning import children_counts_of, rank_paths


class RecyclingStatistics:
    FOLD = 256  # steps whose root facts are summed at once

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
        self.unwritten_rank0 = torch.zeros(2, dtype=torch.long, device=self.device)
        self._root_facts: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(self, accepted: list[int], drafted: tuple[int, ...] | None, root_unwritten: torch.Tensor,
               rank0_hit: torch.Tensor) -> None:
        """One step: accepted template nodes, the drafted template nodes (None: all; () a plain
        step), and two facts, bools on a CPU, 0-d bool tensors on an accelerator: the root's row was
        never written; its rank-0 entry was the target's token. They are summed in bulk (every FOLD
        steps and in `take`), not one small device operation each per step."""
        self.steps += 1
        for v in accepted:
            self.hits[v - 1] += 1
        self.drafted[drafted] += 1
        self._root_facts.append((root_unwritten, rank0_hit))
        if len(self._root_facts) >= self.FOLD:
            self._fold()

    def _fold(self) -> None:
        if self._root_facts:
            on_host = [pair for pair in self._root_facts if isinstance(pair[0], bool)]
            tensors = [t for pair in self._root_facts if not isinstance(pair[0], bool) for t in pair]
            if on_host:
                self.unwritten_rank0 += torch.tensor([sum(a for a, _ in on_host), sum(b for _, b in on_host)],
                                                     device=self.device)
            if tensors:
                self.unwritten_rank0 += torch.stack(tensors).view(-1, 2).sum(dim=0)
            self._root_facts = []

    def take(self) -> dict:
        n = len(self.template)
        self._fold()
        unwritten, rank0 = self.unwritten_rank0.tolist()
        drafted = [0] * n
        for nodes, count in self.drafted.items():
            for v in range(1, n + 1) if nodes is None else nodes:
                drafted[v - 1] += count
        depths = self.template.depths.tolist()[1:]
        depth_hits = [0] * self.template.max_depth
        for v, h in enumerate(self.hits):
            depth_hits[depths[v] - 1] += h
        out = {"tree": self._tree, "steps": self.steps, "node_hits": list(self.hits), "node_drafted": drafted,
               "depth_hits": depth_hits, "root_row_unwritten": unwritten,
               "root_rank0_hits": rank0}
        self.clear()
        return out


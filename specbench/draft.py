"""The records that cross the drafter interface, and the shape of a draft.

A `DraftTree` is the static shape (node 0 is the root: the last decided token, not yet in the KV
cache; nodes 1..n are draft tokens; `parents[i]` is the parent of node i+1). A `Draft` puts tokens on
a tree for one step; `DecodeState` is what a drafter may read before it, `StepOutcome` what the
verification forward produced after it. Everything about trees is pure and cached per tree, so a
drafter that reuses one static tree pays for its masks once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import torch

from specbench.errors import SettingsError


class DraftTree:
    """A static tree shape (no tokens); nodes are numbered breadth-first or at least parent-first."""

    def __init__(self, parents: list[int] | tuple[int, ...]):
        parents = tuple(int(p) for p in parents)
        for i, p in enumerate(parents):
            if not 0 <= p <= i:
                raise ValueError(
                    f"draft node {i + 1} has parent {p}; a parent must be the root (0) or an earlier node"
                )
        self.parents = parents

    def __len__(self) -> int:
        """Number of draft nodes (the root excluded)."""
        return len(self.parents)

    @property
    def size(self) -> int:
        """Number of rows in the verification forward: root + draft nodes."""
        return len(self.parents) + 1

    @cached_property
    def depths(self) -> torch.Tensor:
        """Depth of every node, root = 0; position id offset of each row."""
        d = [0]
        for p in self.parents:
            d.append(d[p] + 1)
        return torch.tensor(d, dtype=torch.long)

    @cached_property
    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parents):
            kids[p].append(i + 1)
        return kids

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """Bool (size, size): row i sees column j iff j is i or an ancestor of i."""
        m = torch.zeros(self.size, self.size, dtype=torch.bool)
        m[0, 0] = True
        for i, p in enumerate(self.parents, start=1):
            m[i] = m[p]
            m[i, i] = True
        return m

    @cached_property
    def is_chain(self) -> bool:
        return all(p == i for i, p in enumerate(self.parents))

    @cached_property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def path_to(self, node: int) -> list[int]:
        """Nodes from the root (excluded) down to `node` (included)."""
        path = []
        while node != 0:
            path.append(node)
            node = self.parents[node - 1]
        return path[::-1]

    @staticmethod
    @lru_cache(maxsize=64)
    def chain(n: int) -> "DraftTree":
        """A single chain of n draft tokens (PLD and friends)."""
        return DraftTree(tuple(range(n)))

    @staticmethod
    def from_children_counts(children: list[list[int]]) -> "DraftTree":
        """Expand a template given as child counts per node, depth by depth, breadth-first.

        children[d][j] = number of children of the j-th node at depth d. This is the form in which
        Token Recycling publishes its trees.
        """
        parents: list[int] = []
        level = [0]  # node indices at the current depth
        for d, counts in enumerate(children):
            if len(counts) != len(level):
                raise SettingsError(
                    f"tree template depth {d} lists {len(counts)} child counts but there are "
                    f"{len(level)} nodes at that depth"
                )
            nxt = []
            for node, c in zip(level, counts):
                if c < 0:
                    raise SettingsError(f"tree template depth {d}: negative child count {c}")
                for _ in range(c):
                    parents.append(node)
                    nxt.append(len(parents))
            level = nxt
        if not parents:
            raise SettingsError("the tree template (method.tree) has no draft nodes; give it at least one "
                                "node, or use method=ar for plain decoding")
        return DraftTree(parents)

    def sibling_rank(self) -> list[int]:
        """For each draft node, its rank among its parent's children (0 = first)."""
        ranks = []
        seen: dict[int, int] = {}
        for p in self.parents:
            ranks.append(seen.get(p, 0))
            seen[p] = seen.get(p, 0) + 1
        return ranks


@dataclass
class Draft:
    """Candidate tokens for one step.

    tokens[i] is the token of tree node i+1 (node 0, the root, is the last decided token).
    Drafters with non-candidate rows (Lookahead's Jacobi window) append them as `extra_tokens`
    with `extra_depths` (position offset from the root) and `extra_visibility`, a bool matrix
    (n_extra, tree.size + n_extra) saying which rows each extra row sees. Tree rows never see
    extra rows. Extra rows are never accepted; their logits come back in `StepOutcome.logits`.

    A drafter that estimates its nodes' chances may say so in `node_probs`: node_probs[i] is its
    probability that node i+1 is on the accepted path. A batch policy (speculation/batch_policy.py)
    then ranks and cuts the tree by the drafter's own estimates rather than by generic rates.
    """

    tokens: torch.Tensor
    tree: DraftTree
    extra_tokens: torch.Tensor | None = None
    extra_depths: torch.Tensor | None = None
    extra_visibility: torch.Tensor | None = None
    node_probs: list[float] | None = None

    def __post_init__(self):
        if self.tokens.numel() != len(self.tree):
            raise ValueError(f"draft has {self.tokens.numel()} tokens for a tree of {len(self.tree)} nodes")
        if self.node_probs is not None and len(self.node_probs) != len(self.tree):
            raise ValueError(f"draft has {len(self.node_probs)} node probabilities for a tree of {len(self.tree)} nodes")

    @property
    def n_extra(self) -> int:
        return 0 if self.extra_tokens is None else int(self.extra_tokens.numel())


@dataclass
class DecodeState:
    """What a drafter may look at: the decided sequence (prompt + output; the last one is the root)."""

    tokens: torch.Tensor  # 1-D LongTensor on the CPU
    prompt_len: int
    step: int  # 0 for the first speculative step of a turn


@dataclass
class StepOutcome:
    """What the verification forward produced, for the drafter to learn from."""

    draft: Draft | None
    root: int
    logits: torch.Tensor  # (rows, vocab) on the model's device; row 0 = root, then tree nodes, then extras
    accepted: list[int]  # accepted tree nodes, root excluded, in path order
    bonus: int  # the target's token after the last accepted node
    hidden_states: torch.Tensor | None = None  # (rows, hidden) last layer, when the drafter asks
    emitted: list[int] = field(default_factory=list)  # tokens appended to the output this step
    # seconds of the step's forward (its inputs' loading included), where the host's clock measures
    # it (a CPU target); None where the device runs it asynchronously
    forward_seconds: float | None = None

"""Draft trees named by choices lists, as Medusa publishes them (and EAGLE's static-tree option reads).

A choice is a path of per-head top-k ranks from the root: [0, 2] is head 0's top-1, then head 1's
top-3 under it. Named trees (`mc_sim_7b_63`, Spec-Bench's) live in data/medusa/medusa_trees.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specbench.draft import DraftTree
from specbench.errors import SpecbenchError

TREES_FILE = Path(__file__).resolve().parents[2] / "data" / "medusa" / "medusa_trees.json"


class ChoicesError(SpecbenchError, ValueError):
    """A choices list or tree name that is missing or malformed."""


@dataclass(frozen=True)
class ChoicesTree:
    """A Medusa tree. Node i+1 takes rank `ranks[i]` of head `heads[i]`'s top-k (head = depth - 1)."""

    tree: DraftTree
    heads: tuple[int, ...]
    ranks: tuple[int, ...]

    @property
    def depth(self) -> int:
        return self.tree.max_depth

    def topk_per_head(self) -> list[int]:
        """How many top tokens each head must supply (max rank + 1 at its depth)."""
        k = [0] * self.depth
        for h, r in zip(self.heads, self.ranks):
            k[h] = max(k[h], r + 1)
        return k


def tree_from_choices(choices) -> ChoicesTree:
    """A choice is a path of per-head top-k ranks from the root: [0, 2] = head 0's top-1, then
    head 1's top-3 under it. Nodes are ordered as Medusa orders them (by depth, then by path), so
    every parent precedes its children; every prefix of a choice must itself be a choice."""
    paths = [tuple(int(r) for r in c) for c in choices]
    if not paths:
        raise ChoicesError("Medusa choices list is empty")
    if len(set(paths)) != len(paths):
        raise ChoicesError("Medusa choices list repeats a path")
    for p in paths:
        if not p or min(p) < 0:
            raise ChoicesError(f"Medusa choice {list(p)} must be a non-empty path of ranks >= 0")
    ordered = sorted(paths, key=lambda p: (len(p), p))
    node_of = {p: i + 1 for i, p in enumerate(ordered)}
    parents = []
    for p in ordered:
        if len(p) > 1 and p[:-1] not in node_of:
            raise ChoicesError(f"Medusa choice {list(p)} has no parent {list(p[:-1])} in the list")
        parents.append(node_of[p[:-1]] if len(p) > 1 else 0)
    return ChoicesTree(DraftTree(parents), tuple(len(p) - 1 for p in ordered), tuple(p[-1] for p in ordered))


def load_choices(spec) -> list[list[int]]:
    """A tree name from data/medusa/medusa_trees.json, a JSON file, or an inline list of paths."""
    if isinstance(spec, (str, Path)):
        named = json.loads(TREES_FILE.read_text())
        if str(spec) in named and not str(spec).startswith("_"):
            return named[str(spec)]
        path = Path(spec)
        if not path.is_file():
            names = [k for k in named if not k.startswith("_")]
            raise ChoicesError(f"unknown Medusa choices '{spec}': give one of {', '.join(names)}, "
                                   f"a JSON file, or an inline list of rank paths")
        try:
            spec = json.loads(path.read_text())
        except ValueError as e:
            raise ChoicesError(f"Medusa choices file '{path}' is not valid JSON ({e})") from None
    try:
        return [[int(r) for r in c] for c in spec]
    except (TypeError, ValueError):
        raise ChoicesError(f"method.choices must be a list of rank paths like [[0], [0, 1]], "
                               f"got {spec!r}") from None

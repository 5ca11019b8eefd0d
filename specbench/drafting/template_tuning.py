"""A static Token Recycling template fitted to a model and a machine, from a calibration run.

A calibration run drafts a (large) template and counts, per node, how often it was on the accepted
path (specbench/drafting/recycling_statistics.py). Those rates estimate p(v), the probability that node v
is accepted; beyond the calibrated template, p(child) = p(parent) x q(depth, rank), the rate at
which a (depth, rank) node was accepted when its parent was, pooled over the calibration template.
A step with draft nodes S emits 1 + sum p(v) tokens on average and costs t(|S| + 1) + overhead
(the cost curve plus the per-step work the curve does not see), so the template is grown greedily,
the most probable frontier node first (a node's first child, or its next sibling by rank), and the
prefix of the growth order with the most expected tokens per second is kept. Ranks stay contiguous
and every node's parent comes first, so the result is a template in the published form (child
counts per depth, breadth-first), the same JSON that `method.tree` reads.

Everything here is pure: lists and floats in, lists and floats out.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from specbench.draft import DraftTree

Path = tuple[int, ...]  # a node named by its sibling ranks from the root: (0, 2) = rank 2 under rank 0


def rank_paths(tree: DraftTree) -> list[Path]:
    """The rank path of every draft node of `tree`, in node order."""
    ranks = tree.sibling_rank()
    paths: list[Path] = []
    for i, par in enumerate(tree.parents):
        paths.append((paths[par - 1] if par else ()) + (ranks[i],))
    return paths


def calibrated_probabilities(stats: dict) -> dict[Path, float]:
    """p(v) = hits / drafted for every calibrated node (only nodes drafted at least once)."""
    tree = DraftTree.from_children_counts(stats["tree"])
    return {path: h / d for path, h, d in zip(rank_paths(tree), stats["node_hits"], stats["node_drafted"]) if d}


def conditional_rates(stats: dict) -> dict[tuple[int, int], float]:
    """q(depth, rank) = accepted / parent accepted, pooled over the calibrated nodes of that depth
    and rank (the root counts as accepted at every step its children were drafted)."""
    tree = DraftTree.from_children_counts(stats["tree"])
    depths, ranks = tree.depths.tolist()[1:], tree.sibling_rank()
    hits, drafted = stats["node_hits"], stats["node_drafted"]
    num: dict[tuple[int, int], float] = {}
    den: dict[tuple[int, int], float] = {}
    for v, par in enumerate(tree.parents):
        key = (depths[v], ranks[v])
        parent_hits = drafted[v] if par == 0 else hits[par - 1]
        num[key] = num.get(key, 0.0) + hits[v]
        den[key] = den.get(key, 0.0) + parent_hits
    return {key: num[key] / den[key] for key in num if den[key] > 0}


def probability_model(stats: dict, k: int) -> Callable[[Path], float]:
    """p(path): the calibrated rate where the node was calibrated, else p(parent) x q(depth, rank),
    with q of the nearest calibrated depth for that rank (the shallower on a tie); 0 for ranks
    never calibrated or >= k."""
    direct = calibrated_probabilities(stats)
    q = conditional_rates(stats)
    depths_of: dict[int, list[int]] = {}
    for d, r in sorted(q):
        depths_of.setdefault(r, []).append(d)

    def rate(depth: int, rank: int) -> float:
        if rank not in depths_of:
            return 0.0
        nearest = min(depths_of[rank], key=lambda d: (abs(d - depth), d))
        return q[(nearest, rank)]

    memo: dict[Path, float] = {(): 1.0}

    def p(path: Path) -> float:
        if path in memo:
            return memo[path]
        depth, rank = len(path), path[-1]
        if rank >= k:
            value = 0.0
        elif path in direct:
            value = direct[path]
        else:
            value = p(path[:-1]) * rate(depth, rank)
        memo[path] = value
        return value

    return p


def grow(p: Callable[[Path], float], max_nodes: int, k: int) -> list[tuple[Path, float]]:
    """Nodes in greedy order, the most probable frontier node first, up to max_nodes."""
    order: list[tuple[Path, float]] = []
    frontier: list[tuple[float, int, Path]] = []
    tick = 0

    def push(path: Path) -> None:
        nonlocal tick
        pv = p(path)
        if pv > 0:
            heapq.heappush(frontier, (-pv, tick, path))
            tick += 1

    push((0,))
    while frontier and len(order) < max_nodes:
        neg, _, path = heapq.heappop(frontier)
        order.append((path, -neg))
        push(path + (0,))
        if path[-1] + 1 < k:
            push(path[:-1] + (path[-1] + 1,))
    return order


def best_prefix(order: Sequence[tuple[Path, float]], step_time: Callable[[int], float]) -> tuple[int, float]:
    """(m, rate ratio): the number of grown nodes with the most expected tokens per second, and
    that rate over a plain step's. step_time(w) is a step's time with w rows (root included)."""
    plain = 1.0 / step_time(1)
    best_m, best = 0, plain
    expected = 1.0
    for m, (_, pv) in enumerate(order, start=1):
        expected += pv
        rate = expected / step_time(m + 1)
        if rate > best:
            best_m, best = m, rate
    return best_m, best / plain


def children_counts_of(paths: Sequence[Path]) -> list[list[int]]:
    """Rank paths (parent-closed, contiguous ranks) -> child counts per depth, breadth-first."""
    kids: dict[Path, int] = {}
    for path in paths:
        kids[path[:-1]] = max(kids.get(path[:-1], 0), path[-1] + 1)
    out: list[list[int]] = []
    level: list[Path] = [()]
    while level and any(kids.get(n, 0) for n in level):
        out.append([kids.get(n, 0) for n in level])
        level = [n + (r,) for n in level for r in range(kids.get(n, 0))]
    return out


def tune_template(stats: dict, step_time: Callable[[int], float], max_nodes: int, k: int = 8) -> dict:
    """The template with the most expected tokens per second: {'children', 'nodes', 'depth',
    'expected_tokens', 'speedup_estimate'} (the estimate: its rate over plain decoding's)."""
    p = probability_model(stats, k)
    order = grow(p, max_nodes, k)
    m, ratio = best_prefix(order, step_time)
    chosen = [path for path, _ in order[:m]]
    return {"children": children_counts_of(chosen), "nodes": m,
            "depth": max((len(x) for x in chosen), default=0),
            "expected_tokens": 1.0 + sum(pv for _, pv in order[:m]), "speedup_estimate": ratio}


def trim_template(children: list[list[int]], k: int) -> list[list[int]]:
    """A template without the nodes of sibling rank >= k (and what hangs below them): the
    published tree for a matrix that keeps k candidates per row."""
    tree = DraftTree.from_children_counts(children)
    return children_counts_of([p for p in rank_paths(tree) if max(p) < k])

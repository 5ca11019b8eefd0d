"""A step's inputs in fixed tensors, and the forward over them captured once and replayed (CUDA graphs).

The fixed-shape forward (CUDA's, and `fixed_shapes=True` on a CPU) pads a step's rows to a row bucket
(`compiled.pad_rows`). For each bucket the step's inputs live in one `StepBuffers`: the input ids, each
row's depth in the draft tree and the rows' visibility of each other. A step writes the root and the
draft's tokens into them in place; depths and visibility are rewritten only when the tree differs
from the one the buffers hold (drafters reuse their trees step after step). Positions, the attention
mask and the cache's write slots are not inputs at all: the forward makes them on the device from the
cache's own length (`StaticLayer.cumulative_length`, which compaction sets in place), in `graph_mask`.

So a bucket's forward reads nothing but tensors at fixed addresses, and on CUDA it is captured once as
a `torch.cuda.CUDAGraph` (`capture`) and replayed: no Python, no dynamo guards, no new tensors, no
copy of the outputs (the logits stay in the graph's own buffer until its next replay). `Runners` keeps
one runner per (cache capacity, bucket, hidden states) and builds each once; a capture that fails
leaves that key on the plain call, with one `warning:` line. The same bookkeeping runs on a CPU, where a
runner is the compiled call itself, so everything but the capture is checked there.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from specbench.decoding.transfers import to_device
from specbench.draft import Draft
from specbench.decoding.verify import TreeTensors


class StepBuffers:
    """One row bucket's inputs: `ids` (1, rows) long, `depths` (rows,) long, `visibility` (rows, rows)
    bool. Rows past a step's real ones are padding: they keep stale ids, depth 0 and see only
    themselves (and the prefix), so their softmax is finite; no real row sees them, and compaction drops
    their cache rows."""

    def __init__(self, rows: int, device):
        self.rows = rows
        self.ids = torch.zeros((1, rows), dtype=torch.long, device=device)
        self.depths = torch.zeros(rows, dtype=torch.long, device=device)
        self.visibility = torch.eye(rows, dtype=torch.bool, device=device)
        self._eye = self.visibility.clone()
        self.layout = None  # the tree whose depths and visibility the buffers hold (None: a plain step)

    def fill(self, root: int, draft: Draft | None, tree_tensors: Callable[..., TreeTensors]) -> int:
        """Write a step's rows in place: the root, then the draft's tokens and extra rows. Returns the
        number of real rows."""
        self.ids[0, :1].fill_(root)  # a fill with a host scalar: no copy queued
        if draft is None:
            if self.layout is not None:
                self._set_layout(None, None)
            return 1
        n, e = draft.tree.size, draft.tree.size + draft.n_extra
        if e > self.rows:
            raise ValueError(f"a step of {e} rows does not fit a bucket of {self.rows}")
        self.ids[0, 1:n].copy_(to_device(draft.tokens, self.ids.device), non_blocking=True)
        if draft.n_extra:  # extra rows change every step: their layout is written every time
            self.ids[0, n:e].copy_(to_device(draft.extra_tokens, self.ids.device), non_blocking=True)
            self._set_layout(draft, tree_tensors(draft.tree))
        elif self.layout is not draft.tree:
            self._set_layout(draft, tree_tensors(draft.tree))
        return e

    def _set_layout(self, draft: Draft | None, tt: TreeTensors | None) -> None:
        self.visibility.copy_(self._eye)
        self.depths.zero_()
        if draft is None:
            self.layout = None
            return
        n = draft.tree.size
        self.depths[:n] = tt.depths
        self.visibility[:n, :n] = tt.ancestors
        if draft.n_extra:
            e = n + draft.n_extra
            self.depths[n:e] = to_device(draft.extra_depths, self.depths.device)
            self.visibility[n:e, :e] = to_device(draft.extra_visibility, self.depths.device)
            self.layout = object()  # never a tree: the next step rewrites the layout
        else:
            self.layout = draft.tree


def graph_mask(base: torch.Tensor, depths: torch.Tensor, visibility: torch.Tensor, capacity: int,
               dtype: torch.dtype, sliding_window: int | None = None):
    """The additive mask (1, 1, rows, capacity) of a step whose rows are written at cache slots
    [base, base + rows): every row sees the prefix [0, base), and among the step's own slots what
    `visibility` allows; later slots are hidden. `base` is a 0-d device tensor (the cache's length), so
    the mask is made on the device with no host value in it. With `sliding_window`, a per-layer-type
    dict, the sliding layers' prefix limited to positions above the row's position - window (what a
    sliding layer saw decoding one token at a time)."""
    rows = depths.shape[0]
    cols = torch.arange(capacity, device=depths.device)
    rel = cols - base
    in_step = (rel >= 0) & (rel < rows)
    prefix = cols < base
    allowed = prefix[None, :] | (in_step[None, :] & visibility[:, rel.clamp(0, rows - 1)])
    lo = torch.finfo(dtype).min

    def additive(ok):
        return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill(~ok, lo)[None, None]

    if sliding_window is None:
        return additive(allowed)
    pos = base + depths
    too_old = prefix[None, :] & (cols[None, :] <= pos[:, None] - sliding_window)
    return {"full_attention": additive(allowed), "sliding_attention": additive(allowed & ~too_old)}


def capture(call: Callable[[], tuple], reset: Callable[[], None], device) -> Callable[[], tuple]:
    """`call` (a forward over fixed buffers) captured as a CUDA graph; returns the replay, which gives
    the captured outputs (the graph's own tensors, rewritten by each replay). `reset` puts the cache
    back before each run that advances it (warm-up and capture each write a step's rows). Warm-up on a
    side stream first, as torch's CUDA graph docs ask: lazy initialisations and allocator state must
    not land inside the capture."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            reset()
            call()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    reset()
    with torch.cuda.graph(graph):  # a private memory pool: one graph's replay never overwrites another's
        outputs = call()
    reset()

    def replay():
        graph.replay()
        return outputs

    replay.graph = graph
    return replay


class Runners:
    """One runner per key (capacity, bucket, hidden), each built once by `build(key, *context)`;
    `make_graph(key, plain, *context)` turns a plain runner into a replayed one (None: no graphs, the
    CPU). `context` is what building needs beyond the key (the cache, its live length). A graph that
    fails to capture leaves its key on the plain runner and says so once in a `warning:` line: an
    optional accelerator never takes a run down."""

    def __init__(self, build: Callable[..., Callable], make_graph: Callable[..., Callable] | None):
        self.build, self.make_graph = build, make_graph
        self._runners: dict[tuple, Callable] = {}
        self.captured: set[tuple] = set()
        self.failed: dict[tuple, str] = {}

    def __contains__(self, key: tuple) -> bool:
        return key in self._runners

    def get(self, key: tuple, *context) -> Callable:
        runner = self._runners.get(key)
        if runner is None:
            runner = self._runners[key] = self._make(key, context)
        return runner

    def _make(self, key: tuple, context: tuple) -> Callable:
        plain = self.build(key, *context)
        if self.make_graph is None:
            return plain
        try:
            runner = self.make_graph(key, plain, *context)
        except Exception as e:  # noqa: BLE001 (any failure of the capture: the plain call goes on)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            self.failed[key] = reason
            print(f"warning: capturing the forward as a CUDA graph failed (cache {key[0]}, rows {key[1]}; "
                  f"{type(e).__name__}: {reason[:200]}): continuing on the forward without the graph",
                  file=sys.stderr)
            return plain
        self.captured.add(key)
        return runner

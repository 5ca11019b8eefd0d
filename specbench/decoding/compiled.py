"""The compiled target forward: a static KV cache written in place and `torch.compile`d verification.

The eager forward is overhead-bound, so a speedup measured on it is partly a framework effect; this
module runs the same verification forward compiled, over a transformers `Cache` of `StaticLayer`s
written and compacted in place (`kv_cache.compact_kv_cache`). CPU: attention over the live rows only
(`LiveStaticLayer`), the row count symbolic, so one inductor graph per cache capacity serves every
draft size; the products on our packed kernel (packed_linear.py) or inductor's. CUDA: a fixed
capacity and one CUDA graph per row bucket; `fixed_shapes=True` runs those shapes on CPU for the
tests. Padded rows are real rows that nothing reads, dropped by the compaction; the prefill stays
eager. Design, iterations and measurements: docs/compiled-forward.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time

import torch
from transformers.cache_utils import Cache, StaticLayer

from specbench.decoding import packed_linear
from specbench.decoding.forward_choice import planned_forward
from specbench.decoding.kv_cache import cache_keyword
from specbench.decoding.step import ModelFacts
from specbench.decoding.packed_linear import with_packed_linears
from specbench.decoding.static_step import Runners, StepBuffers, capture, graph_mask
from specbench.draft import Draft
from specbench.errors import SpecbenchError

# One CUDA graph each, and each a compile of its own. Few, because on the GPUs measured a forward costs
# nearly the same from 1 to 128 rows (results/gpu/), so padding up to a bucket is nearly free, while
# nine buckets did not finish compiling in a lent GPU's slot (docs/compiled-forward.md). Wider drafts:
# multiples of 64.
CUDA_ROW_BUCKETS = (1, 16, 128)


def pad_rows(rows: int, fixed: bool) -> int:
    """The row count the compiled forward runs for `rows` real rows: at least 2 with a symbolic row
    count, else the row bucket (fixed shapes: CUDA graphs)."""
    if not fixed:
        return max(rows, 2)
    for b in CUDA_ROW_BUCKETS:
        if rows <= b:
            return b
    return int(math.ceil(rows / 64) * 64)


def padded_mask(mask: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """Widen an engine mask `[1, 1, r, c]` to `[1, 1, rows, width]`: columns past c are hidden
    from every row; padded rows (r..rows) see column 0 only, so their softmax stays finite. A mask
    that already has that shape (on CPU, every step of 2 rows or more) is returned as it is."""
    if mask.shape[-2:] == (rows, width):
        return mask
    lo = torch.finfo(mask.dtype).min
    out = torch.full((1, 1, rows, width), lo, dtype=mask.dtype, device=mask.device)
    r, c = mask.shape[-2:]
    out[..., :r, :c] = mask
    out[..., r:, 0] = 0
    return out


class LiveStaticLayer(StaticLayer):
    """A static layer that hands attention only its first `live.shape[0]` rows (the live prefix and
    the step's rows) instead of the whole buffer. `live` is a tensor whose length, symbolic in the
    compiled graph, is that row count: attention then costs what the context costs, not what the
    capacity does (SDPA on this CPU takes time in proportion to the columns it is given, masked or
    not). None: the whole buffer (the CUDA graphs, whose shapes are fixed)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # an attribute of the instance from the start: dynamo guards on whether the instance holds it,
        # and the first graph traced without it would be refused once a call had set it
        self.live: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        if self.live is None:
            return keys, values
        n = self.live.shape[0]
        return keys[:, :, :n], values[:, :, :n]


def static_cache(n_layers: int, capacity: int) -> Cache:
    """A cache of plain static layers, sliding-window layers included: a sliding static layer keeps the
    last rows of a multi-row update, rejected tree rows too, which no compaction can undo. The engine's
    per-layer-type masks apply the window instead."""
    return Cache(layers=[LiveStaticLayer(max_cache_len=capacity) for _ in range(n_layers)])


class StackedBuffers:
    """Every layer's keys, values and length as views of three tensors (layers first), so that a step's
    compaction is one gather and one scatter for the whole cache (kv_cache._compact_static): on CUDA,
    4 kernel launches instead of 5 per layer."""

    def __init__(self, layers: list):
        self.keys = torch.stack([layer.keys for layer in layers])
        self.values = torch.stack([layer.values for layer in layers])
        self.lengths = torch.stack([layer.cumulative_length for layer in layers])


def stack_layers(layers: list) -> None:
    """Rebind each static layer's buffers to views of one `StackedBuffers` (kept on every layer)."""
    stacked = StackedBuffers(layers)
    for i, layer in enumerate(layers):
        layer.keys, layer.values, layer.cumulative_length = stacked.keys[i], stacked.values[i], stacked.lengths[i]
        for t in (layer.keys, layer.values, layer.cumulative_length):
            torch._dynamo.mark_static_address(t)  # a CUDA graph replays on these addresses
        layer.stacked = stacked


def model_identity_guards(entries) -> list[bool]:
    """Dynamo's guard filter: of the guards on the model's modules (a few thousand type and dict checks,
    a cost paid on every call) keep only the identity of its parameters and buffers. The weights
    are frozen into the graph, so a model with other weights must not reuse it (two engines in one
    process); the module structure does not change under an engine."""
    return [not e.orig_guard.source.is_unspecialized_nn_module() or e.guard_type == "ID_MATCH" for e in entries]


def uses_packed_products(products: str, device, dtype) -> bool:
    """Whether the compiled forward's matrix products run on our packed kernel: `packed`, or `auto` where
    the kernel runs and builds (an x86-64 CPU with AVX2, float32 weights); `inductor` keeps inductor's own
    (its C++ GEMM template or oneDNN). `packed` where the kernel cannot build raises KernelBuildError."""
    if planned_forward("on", products, device, dtype) != "compiled-packed":
        return False
    return products == "packed" or packed_linear.build_problem() is None


def cache_capacity(cache) -> int:
    return cache.layers[0].max_cache_len


class CompiledForward:
    """The compiled verification forward, two ways. Symbolic rows (a CPU's default): `rows(cache,
    cache_len, ids, pos, mask, hidden)` -> (logits, last hidden state) for the real rows, through one
    compiled call; `make_mask(visibility, depths, cache_len)` is the engine's mask builder (a plain step,
    which the eager forward leaves to the model, needs one here). Fixed shapes (CUDA; `fixed_shapes=True`
    on a CPU): `step(cache, cache_len, root, draft, tree_tensors, hidden)` writes the rows into static
    buffers and runs the bucket's runner, a replayed CUDA graph on CUDA (static_step.py).
    `cache_for(prompt_len, max_new)` hands out the static cache for a turn."""

    def __init__(self, model, make_mask, margin_rows: int | None = None, fixed_shapes: bool | None = None,
                 products: str = "auto"):
        self.make_mask = make_mask
        self.device = model.device
        self.cuda = self.device.type == "cuda"
        # fixed shapes (CUDA's way: row buckets, static input buffers, attention over the whole buffer)
        # can be asked for on CPU too, without CUDA graphs, so that everything but the capture is
        # checked where no GPU is; CUDA always takes them
        self.fixed = self.cuda or bool(fixed_shapes)
        # the matrix products: our packed kernel (CPU, float32, AVX2) or inductor's own
        self.packed = uses_packed_products(products, self.device, model.dtype) and not self.fixed
        t0 = time.perf_counter()
        self.model = with_packed_linears(model) if self.packed else model
        self.name = "compiled-packed" if self.packed else "compiled"  # the forward's name in results
        self._cache_keyword = cache_keyword(model)  # read once: the traced forward sees a constant
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.n_layers = cfg.num_hidden_layers
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        # room past prompt + max_new for one verification's rows (a wider draft grows the cache)
        self.margin = margin_rows if margin_rows is not None else (256 if self.fixed else 128)
        self.round_to = 1024 if self.fixed else 512  # capacities, each with its own graphs
        self._caches: dict[int, list] = {}  # the layers of each capacity
        self.reserved: int | None = None  # the capacity the run reserved (reserve=True), used by every turn that fits
        self.compile_seconds = time.perf_counter() - t0  # packing weights, then prepare(): compiling, recording
        self._prepared: set = set()
        self.graphs_prepared = 0
        self._one_row = (torch.ones((1, 1), dtype=torch.bool, device=self.device),
                         torch.zeros(1, dtype=torch.long, device=self.device))  # a plain step's visibility, depth
        # The recompile limit counts graphs per code object: row buckets x {hidden, not} x capacities.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        if self.fixed:
            facts = ModelFacts.of(model)
            self.sliding_window, self.mask_dtype = facts.sliding_window, facts.mask_dtype
            self._buffers: dict[int, StepBuffers] = {}  # per row bucket
            # CUDA: each (capacity, bucket, hidden) captured once as a CUDA graph over the compiled
            # forward, then replayed; a CPU runs the compiled call itself on the same buffers
            self.runners = Runners(self._plain_runner, self._graph_runner if self.cuda else None)
            self._compiled = torch.compile(self._forward_static, fullgraph=True, dynamic=False,
                                           options={"guard_filter_fn": model_identity_guards})
        else:
            self._compiled = torch.compile(self._forward, fullgraph=True, dynamic=True,
                                           options={"guard_filter_fn": model_identity_guards})

    def _forward(self, ids, pos, mask, cache, hidden: bool):
        out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask, **{self._cache_keyword: cache},
                         use_cache=True, output_hidden_states=hidden)
        return out.logits, (out.hidden_states[-1] if hidden else None)

    def _forward_static(self, ids, depths, visibility, cache, hidden: bool):
        """The fixed-shape forward over one bucket's buffers (static_step.StepBuffers): positions and
        mask made here, on the device, from the cache's length before the step's rows are written."""
        base = cache.layers[0].cumulative_length
        pos = (base + depths)[None]  # a new tensor now, before the layers advance `base` in place
        mask = graph_mask(base, depths, visibility, cache.layers[0].max_cache_len, self.mask_dtype,
                          self.sliding_window)
        return self._forward(ids, pos, mask, cache, hidden)

    def cache_for(self, prompt_len: int, max_new: int, reserve: bool = False, exact: bool = False) -> Cache:
        """The turn's cache, emptied: one set of buffers per capacity, kept for the process. A compiled
        graph keeps the very buffers it was compiled on (transformers marks them static; with frozen
        weights inductor binds them into the graph, and on CUDA a graph replays on their addresses),
        so a capacity must always come with the same buffers. The smallest kept capacity that fits is
        taken (with fixed shapes, only one with at most `round_to` to spare: every call attends over the
        whole buffer, so a spare column costs time; or the reserved one), else a new one. `reserve`: this
        turn's capacity is the run's reserved one (the runner asks for it with the longest prompt, so
        that no turn makes a capacity, with its graphs and buffers, mid-run). `exact`: no margin on the
        CPU, for a caller that knows its widest step (a cost curve's, which then fits a short run's
        reserved capacity instead of compiling one of its own); fixed shapes keep it, as their row
        buckets pad a step past its rows."""
        need = prompt_len + max_new + (0 if exact and not self.fixed else self.margin)
        # CPU: attention sees only the live rows, so spare capacity costs nothing and any kept one that
        # fits will do (fewer capacities, fewer compiles); CUDA graphs attend over the whole buffer,
        # but a spare column costs less than a new capacity's graphs and memory
        fits = [c for c in self._caches
                if need <= c and (not self.fixed or c <= need + self.round_to or c == self.reserved)]
        capacity = min(fits) if fits else int(math.ceil(need / self.round_to) * self.round_to)
        if reserve:
            self.reserved = capacity
        cache = self._cache_of(capacity)
        for layer in cache.layers:
            layer.cumulative_length.zero_()
        return cache

    def fits(self, cache: Cache, prompt_len: int, max_new: int) -> bool:
        """Whether a turn of this prompt and budget runs on `cache` as it is (a kept conversation's
        cache, engine.KeptPrefix) with the margin cache_for would give it."""
        return prompt_len + max_new + self.margin <= cache_capacity(cache)

    def _cache_of(self, capacity: int) -> Cache:
        """A cache over this capacity's layers (a new object each time: a grown turn swaps its layers
        out, and the kept ones must stay)."""
        if capacity not in self._caches:
            cache = static_cache(self.n_layers, capacity)
            cache.early_initialization(1, self.kv_heads, self.head_dim, self.model.dtype, self.device)
            if not self.fixed:  # every dim static: a symbolic head count could be unified with a row count
                for layer in cache.layers:
                    for buf in (layer.keys, layer.values):
                        for d in range(buf.dim()):
                            torch._dynamo.mark_static(buf, d)
            else:  # CUDA's way: compaction moves every layer's rows in one operation, not 5 per layer
                stack_layers(cache.layers)
            self._caches[capacity] = cache.layers
        return Cache(layers=list(self._caches[capacity]))

    def _grow(self, cache: Cache, cache_len: int, need: int, hidden: bool) -> None:
        """Move the live rows into the buffers of a larger capacity (a draft wider than the margin),
        in the same cache object; that capacity's graphs are made first (making them writes rows)."""
        bigger = self._cache_of(int(math.ceil(need / self.round_to) * self.round_to))
        self.prepare(bigger, hidden)
        for old, new in zip(cache.layers, bigger.layers):
            new.keys[..., :cache_len, :] = old.keys[..., :cache_len, :]
            new.values[..., :cache_len, :] = old.values[..., :cache_len, :]
            new.cumulative_length.fill_(cache_len)
        cache.layers = list(bigger.layers)

    def prepare(self, cache: Cache, hidden: bool) -> None:
        """Compile (CPU) or compile and capture (CUDA) every shape a turn on `cache` can run, before
        anything is timed. Symbolic rows (CPU): one graph per capacity and `hidden`; fixed shapes: one
        runner per row bucket on this cache's buffers (a CUDA graph replays on fixed addresses). The
        cache is left empty."""
        key = (cache_capacity(cache), hidden)
        if key in self._prepared:
            return
        print(f"compiling the {self.name} forward for a cache of {key[0]} rows before anything is timed "
              "(minutes the first time on a machine; inductor's cache makes later runs quicker)", file=sys.stderr)
        t0 = time.perf_counter()
        if hidden:  # transformers installs its hidden-state hooks on first use, under a lock dynamo
            # cannot trace: let an eager call install them
            self.model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device), use_cache=False,
                       output_hidden_states=True)
        if self.fixed:
            for b in (b for b in CUDA_ROW_BUCKETS if b + 1 <= cache_capacity(cache)):
                self.runners.get((cache_capacity(cache), b, hidden), cache, 1)
        else:
            # a context of 37 makes the live length (39) a size no static dim has, so the graph keeps it
            # symbolic instead of tying it to one
            _set_length(cache, 37)
            self._call(cache, 37, torch.zeros(2, dtype=torch.long, device=self.device),
                       torch.full((2,), 37, dtype=torch.long, device=self.device), None, hidden)
        _set_length(cache, 0)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.compile_seconds += time.perf_counter() - t0
        self._prepared.add(key)
        self.graphs_prepared = _graph_count()

    def recompiles(self) -> int:
        """Graphs compiled since the last `prepare`: 0 unless a timed step hit a shape it did not expect."""
        return _graph_count() - self.graphs_prepared

    # -- fixed shapes: static buffers, runners (CUDA graphs) -------------------------------------------

    def load(self, cache: Cache, cache_len: int, root: int, draft: Draft | None, tree_tensors, hidden: bool):
        """A step on the fixed-shape path, up to its forward: the rows written into their bucket's
        buffers in place (the cache grown first if they do not fit). Returns (the bucket's runner, which
        `runner(cache)` runs (a CUDA graph's replay on CUDA) and which gives the padded (logits, hidden
        states), the rows' input ids on the device, the number of real rows)."""
        bufs = self.buffers(pad_rows(1 if draft is None else draft.tree.size + draft.n_extra, True))
        if cache_len + bufs.rows > cache_capacity(cache):
            self._grow(cache, cache_len, cache_len + bufs.rows + self.margin, hidden)
        r = bufs.fill(root, draft, tree_tensors)
        runner = self.runners.get((cache_capacity(cache), bufs.rows, hidden), cache, cache_len)
        return runner, bufs.ids[0, :r], r

    def step(self, cache: Cache, cache_len: int, root: int, draft: Draft | None, tree_tensors,
             hidden: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`load`, then the forward: (the rows' input ids, logits, last hidden state), real rows only,
        as views (on CUDA the graph's own outputs: valid until this bucket's next replay)."""
        runner, ids, r = self.load(cache, cache_len, root, draft, tree_tensors, hidden)
        logits, hs = runner(cache)
        return ids, logits[0, :r], (hs[0, :r] if hidden else None)

    def buffers(self, rows: int) -> StepBuffers:
        """The input buffers of the `rows` bucket, made once: every capacity's runner reads the same ones."""
        if rows not in self._buffers:
            self._buffers[rows] = StepBuffers(rows, self.device)
        return self._buffers[rows]

    def _plain_runner(self, key: tuple, cache: Cache, length: int):
        """The compiled call over the bucket's buffers, compiled now (first call) with our settings;
        the cache's length is put back to `length` afterwards (the call wrote a step's rows)."""
        _, rows, hidden = key
        bufs, compiled = self.buffers(rows), self._compiled

        def run(cache):
            return compiled(bufs.ids, bufs.depths, bufs.visibility, cache, hidden)

        _set_length(cache, length)
        self._with_settings(rows, cache, lambda: run(cache))
        _set_length(cache, length)
        return run

    def _graph_runner(self, key: tuple, plain, cache: Cache, length: int):
        """`plain` captured as a CUDA graph on this cache's buffers (static_step.capture)."""
        return _ignore_cache(capture(lambda: plain(cache), lambda: _set_length(cache, length), self.device))

    # -- symbolic rows (CPU): the engine's ids, positions and mask, live columns only ---------------------

    def rows(self, cache: Cache, cache_len: int, ids: torch.Tensor, pos: torch.Tensor, mask,
             hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One verification forward over `ids` (1-D, real rows) at positions `pos` on the symbolic-rows
        path; `mask` is the engine's (a tensor or a per-layer-type dict, None for a plain step).
        Returns (logits, hidden) for the real rows. The fixed-shape path takes `step` instead."""
        if self.fixed:
            raise RuntimeError("the fixed-shape forward takes its rows through step()")
        r = ids.shape[0]
        if cache_len + pad_rows(r, False) > cache_capacity(cache):
            self._grow(cache, cache_len, cache_len + pad_rows(r, False) + self.margin, hidden)
        return self._call(cache, cache_len, ids, pos, mask, hidden)

    def _call(self, cache, cache_len, ids, pos, mask, hidden):
        r = ids.shape[0]
        rows = pad_rows(r, False)
        if rows > r:
            ids = torch.cat([ids, ids[:1].expand(rows - r)])
            pos = torch.cat([pos, pos[:1].expand(rows - r)])
        if mask is None:
            mask = self.make_mask(*self._one_row, cache_len)
        width = cache_len + rows  # the live rows only (LiveStaticLayer)
        if isinstance(mask, dict):
            mask = {k: padded_mask(m, rows, width) for k, m in mask.items()}
        else:
            mask = padded_mask(mask, rows, width)
        ids, pos = ids[None], pos[None]
        # one graph for every row count (dynamic=True alone lets a size that equals some static size, a
        # head count say, be specialised). The capacity stays static: with it symbolic, a graph traced
        # at one capacity failed its input asserts at another (torch 2.13), so each capacity gets its
        # graph in prepare()
        live = torch.empty(width, device=self.device)
        for layer in cache.layers:
            layer.live = live
        torch._dynamo.maybe_mark_dynamic(live, 0)
        for t in (ids, pos):
            torch._dynamo.maybe_mark_dynamic(t, 1)
        for m in (mask.values() if isinstance(mask, dict) else (mask,)):
            torch._dynamo.maybe_mark_dynamic(m, 2)
            torch._dynamo.maybe_mark_dynamic(m, 3)
        try:
            logits, hs = self._with_settings(r, cache, lambda: self._compiled(ids, pos, mask, cache, hidden))
        finally:  # the eager prefill on these layers takes the whole buffer, as transformers' mask expects
            for layer in cache.layers:
                layer.live = None
        return logits[0, :r], (hs[0, :r] if hidden else None)

    def _with_settings(self, rows: int, cache, call):
        """`call()` under the settings our graphs are compiled with (read while tracing, so a call that
        compiles nothing pays only for entering them)."""
        # Grouped-query attention inside SDPA instead of transformers' repeat_kv, which copies the whole
        # cache buffer per layer per step (with a mask transformers only does that on XPU/MPS).
        # specialize_float: with dynamic shapes a Python float of the model (a scaling constant) is
        # traced as a symbol, found constant, and the whole trace restarts (a third of the compile time)
        try:
            # Not on the fixed-shape path: its later calls run outside these settings, and dynamo guards
            # on the variable it read (CUDA, where that path is for, keeps repeat_kv anyway)
            gqa = sdpa_gqa_with_mask(self.device) and not self.fixed
            with _env("TRANSFORMERS_SDPA_FORCE_GQA", "1" if gqa else None), \
                    self._inductor_config(), \
                    torch._dynamo.config.patch(specialize_float=True, fail_on_recompile_limit_hit=True):
                return call()
        except torch._dynamo.exc.FailOnRecompileLimitHit as e:  # never a silent fall back to eager
            raise RecompileLimitError(
                f"the compiled forward met more shapes than its recompile limit "
                f"({torch._dynamo.config.recompile_limit}) allows and would go on eager uncounted "
                f"({e}); rerun with compile=off, or report the shapes (rows {rows}, cache "
                f"{cache_capacity(cache)})") from None

    def _inductor_config(self):
        """CPU: freezing folds the weights into constants and prepacks them for oneDNN (it needs grad
        off at compile time: the engine runs in inference mode). Scoped to our calls, as a patch."""
        if self.fixed:  # CUDA, or CUDA's shapes checked on CPU, where speed does not matter
            return contextlib.nullcontext()
        import torch._inductor.config as inductor_config

        if self.packed:  # no products left for inductor to choose kernels for. cpp_wrapper: the graph's
            # kernel and op calls from C++, not Python (whose wrapper was a visible share of a step).
            # realize_opcount_threshold: the rotary cos/sin are computed once per step into a buffer;
            # at the default inductor inlined them into each layer's q and k kernels, twice a layer a
            # step (measurements of both: docs/compiled-forward.md)
            return inductor_config.patch({"freezing": True, "cpp_wrapper": True, "realize_opcount_threshold": 4})

        # concat_linear: one product for linears that share an input (q/k/v, gate/up): fewer, larger GEMMs.
        # max_autotune: inductor's C++ GEMM template against oneDNN, per weight shape, fastest kept: a
        # faster forward for minutes more of compiling (docs/compiled-forward.md)
        return inductor_config.patch({"freezing": True, "cpp.enable_concat_linear": True, "max_autotune": True,
                                      "max_autotune_gemm_backends": "CPP,ATEN"})


class RecompileLimitError(SpecbenchError):
    """A compiled forward that would silently turn eager: the run stops with one line instead."""


def sdpa_gqa_with_mask(device) -> bool:
    """Whether attention takes grouped-query heads inside SDPA (`enable_gqa`) with our tree mask,
    instead of transformers' repeat_kv, which copies the whole cache per layer per step. On the CPU
    that pays; on CUDA, SDPA's fast kernels take no GQA with a mask and it falls to the math kernel,
    so transformers' own choice (repeat_kv there) stands."""
    return torch.device(device).type == "cpu"


@contextlib.contextmanager
def _env(name: str, value: str | None):
    """`name` set to `value` (None: left as it is) for the duration."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _set_length(cache, n: int) -> None:
    """Every layer's length (its next write slot) set to n, in place (the addresses graphs replay on)."""
    stacked = getattr(cache.layers[0], "stacked", None)
    if stacked is not None:
        stacked.lengths.fill_(n)
        return
    for layer in cache.layers:
        layer.cumulative_length.fill_(n)


def _ignore_cache(replay):
    """A replay as a runner: the cache it is handed is the one it was captured on."""
    def run(cache):
        return replay()

    run.graph = replay.graph
    return run


def _graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])

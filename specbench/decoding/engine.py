"""The decoding loop: prefill, then draft -> one tree forward -> verify -> compact KV -> observe.

Batch size 1. The engine knows nothing of any method: a drafter hands it a `Draft` (or None for a
plain step) and gets a `StepOutcome` back. Prefill, verification and the stop are step.py's, shared
with the batched engine (batched.py); what is this engine's own is the forward (eager or compiled)
and its cache.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from specbench.draft import Draft, DraftTree, StepOutcome
from specbench.drafter import Drafter, reads_hidden_states, reads_prompt_logits
from specbench.decoding.kv_cache import compact_kv_cache, with_cache
from specbench.decoding.masks import tree_attention_mask
from specbench.decoding.step import (ModelFacts, PhaseClock, TreeTensorCache, check_context, cut_at_stop,
                                     greedy_targets, observe_prefill, prefill, propose, rows_of, split_piece,
                                     token_buffer, verify_piece)
from specbench.decoding.transfers import on_host, to_device
from specbench.decoding.verify import TreeTensors
from specbench.timing import now


@dataclass
class TurnResult:
    tokens: list[int]  # new tokens, EOS included if produced
    wall_time: float  # prefill + decoding, device-synchronised
    prefill_time: float
    decoding_steps: int
    accept_lengths: list[int]  # per step: accepted draft tokens + 1 (the bonus)
    forward_time: float = 0.0  # time inside model forwards during decoding (profile=True only)
    step_rows: list[int] = field(default_factory=list)  # rows per verification forward
    step_drafted: list[int] = field(default_factory=list)  # draft tree nodes per step (0: a plain step)
    step_times: list[float] = field(default_factory=list)  # wall seconds of each step
    # host seconds of each step inside the drafter's propose() and observe()
    step_propose_times: list[float] = field(default_factory=list)
    step_observe_times: list[float] = field(default_factory=list)
    # the turn's decoding time by phase (step.PHASES): seconds summed over its steps
    phase_seconds: dict[str, float] = field(default_factory=dict)
    kv_cache_bytes: int | None = None  # the cache at the turn's end, where generate was given measure_cache
    prefix_reused: int = 0  # prompt tokens whose rows came from the conversation's kept cache (KeptPrefix)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)


@dataclass
class KeptPrefix:
    """One conversation's KV cache kept from turn to turn, as a serving engine with prefix caching keeps
    it (vLLM's automatic prefix caching): a turn prefills only the prompt past the longest prefix it
    shares with `tokens`, the decided tokens whose rows the cache holds. Owned by whoever runs the
    conversation (run/question_loop.py: one per question and drafter), never shared between drafters."""

    tokens: list[int] = field(default_factory=list)
    cache: object = None


def shared_prefix(kept: list[int], prompt: list[int]) -> int:
    """How many of `prompt`'s tokens a cache holding `kept` can serve: their common prefix, less one,
    so that the prompt's last token is always prefilled (its logits choose the first new token)."""
    n = 0
    for a, b in zip(kept, prompt[:-1]):
        if a != b:
            break
        n += 1
    return n


class Engine:
    """Per step on an accelerator, the host sends the root token (as a kernel argument) and the
    drafter's tokens stay where the drafter made them; tree masks, position offsets and the
    verification run on the device, and one small copy brings back the accepted path and its tokens."""

    def __init__(self, model, eos_token_ids: list[int], profile: bool = False, compiled: bool = False,
                 products: str = "auto", fixed_shapes: bool | None = None):
        self.model = model.eval()
        self.device = model.device
        self.eos = set(int(e) for e in eos_token_ids)
        self.profile = profile
        facts = ModelFacts.of(model)
        # attributes, not the frozen facts: a test may set the window to exercise both mask kinds
        self.sliding_window, self.mask_dtype = facts.sliding_window, facts.mask_dtype
        self.context_length = facts.context_length  # a turn may not ask for more new tokens
        self.compiled = None
        # compiled: verification through a compiled forward on a static cache (specbench/decoding/compiled.py);
        # products: its matrix products (auto | packed | inductor, compiled.uses_packed_products);
        # fixed_shapes: CUDA's row buckets and static buffers (None: on CUDA only; True on a CPU for checks)
        if compiled:
            from specbench.decoding.compiled import CompiledForward

            try:
                self.compiled = CompiledForward(model, self._mask, products=products, fixed_shapes=fixed_shapes)
            except Exception as e:  # an optional accelerator: the run goes on eager (forward_choice.py)
                self._fall_back_to_eager(e)
        self.forward_time = 0.0
        self._trees = TreeTensorCache(self.device)
        self._clock: PhaseClock | None = None  # the running turn's step clock

    def new_cache(self, prompt_len: int, max_new_tokens: int, hidden: bool = False, reserve: bool = False,
                  exact: bool = False):
        """The KV cache for one turn: a DynamicCache, or the compiled forward's static cache with every
        shape it can run already compiled (so no compiling happens while a turn is timed). `reserve`:
        make this one the capacity every later turn that fits uses; `exact`: no rows to spare beyond
        max_new_tokens (CompiledForward.cache_for)."""
        if self.compiled is not None:
            try:
                with torch.inference_mode():  # the buffers too: graphs are specialised on inference tensors
                    cache = self.compiled.cache_for(prompt_len, max_new_tokens, reserve, exact)
                    self.compiled.prepare(cache, hidden)
                return cache
            except Exception as e:  # inductor, its compiler, our kernel: none may take the run down
                self._fall_back_to_eager(e)
        return DynamicCache()

    def _turn_cache(self, prefix: KeptPrefix | None, prompt_ids: list[int], max_new_tokens: int,
                    hidden: bool) -> tuple[object, int]:
        """(the turn's cache, how many prompt tokens it already holds): the kept conversation's cache
        cut back to the prefix this prompt shares with it, where there is one and it has room; else a
        new cache."""
        if prefix is not None and prefix.cache is not None:
            reused = shared_prefix(prefix.tokens, prompt_ids)
            room = self.compiled is None or self.compiled.fits(prefix.cache, len(prompt_ids), max_new_tokens)
            if reused and room:
                compact_kv_cache(prefix.cache, reused, [])  # a crop: the rows past the shared prefix go
                return prefix.cache, reused
        return self.new_cache(len(prompt_ids), max_new_tokens, hidden), 0

    @property
    def forward_name(self) -> str:
        """The forward this engine runs: eager, compiled or compiled-packed (as results name it)."""
        return "eager" if self.compiled is None else self.compiled.name

    def _fall_back_to_eager(self, error: Exception) -> None:
        from specbench.decoding.packed_linear import first_error_line

        reason = first_error_line(str(error)) or type(error).__name__
        print(f"warning: the compiled forward failed ({type(error).__name__}: {reason}): "
              "continuing on the eager forward", file=sys.stderr)
        self.compiled = None

    def tree_tensors(self, tree: DraftTree) -> TreeTensors:
        return self._trees(tree)

    def _mask(self, visibility: torch.Tensor, depths: torch.Tensor, cache_len: int):
        """The 4-D mask, built on the device; models mixing sliding and full layers get one per type."""
        full = tree_attention_mask(visibility, depths, cache_len, self.mask_dtype)
        if self.sliding_window is None:
            return full
        sliding = tree_attention_mask(visibility, depths, cache_len, self.mask_dtype,
                                      sliding_window=self.sliding_window)
        return {"full_attention": full, "sliding_attention": sliding}

    @torch.inference_mode()
    def forward_rows(self, cache, cache_len: int, draft: Draft | None, root: int, hidden: bool = False):
        """One verification forward over root + draft rows (+ extra rows). Returns logits, hidden."""
        _, logits, hs = self._run_forward(self._load(cache, cache_len, draft, root, hidden), cache, cache_len,
                                          hidden)
        return logits, hs

    def _load(self, cache, cache_len: int, draft: Draft | None, root: int, hidden: bool):
        """A step's inputs, ready for `_run_forward`: on the fixed-shape path written into the bucket's
        buffers (compiled.load), else made as tensors (`step_inputs`)."""
        if self.compiled is not None and self.compiled.fixed:
            return self.compiled.load(cache, cache_len, root, draft, self.tree_tensors, hidden)
        return self.step_inputs(cache_len, draft, root)

    def _run_forward(self, loaded, cache, cache_len: int, hidden: bool):
        """(the rows' input ids on the device, logits, hidden states) of the forward `_load` prepared."""
        t0 = now(self.device) if self.profile else 0.0
        if self.compiled is not None and self.compiled.fixed:
            runner, ids, r = loaded
            logits, hs = runner(cache)
            logits, hs = logits[0, :r], (hs[0, :r] if hidden else None)
        else:
            ids, pos, mask = loaded
            logits, hs = self._forward(cache, cache_len, ids, pos, mask, hidden)
        if self.profile:
            self.forward_time += now(self.device) - t0
        return ids, logits, hs

    def step_inputs(self, cache_len: int, draft: Draft | None, root: int):
        """(input ids, positions, mask) of a step's rows on the device: root, draft, extra rows. A
        drafter's tokens stay where they are when on the device, else they are queued there once."""
        dev = self.device
        root_row = torch.full((1,), root, dtype=torch.long, device=dev)  # a fill, not a copy
        if draft is None:
            return root_row, torch.full((1,), cache_len, dtype=torch.long, device=dev), None
        tt = self.tree_tensors(draft.tree)
        ids = torch.cat([root_row, to_device(draft.tokens, dev)])
        depths, vis = tt.depths, tt.ancestors
        if draft.n_extra:  # extra rows see what the drafter says; tree rows never see them
            n, e = draft.tree.size, draft.n_extra
            ids = torch.cat([ids, to_device(draft.extra_tokens, dev)])
            depths = torch.cat([depths, to_device(draft.extra_depths, dev)])
            vis = torch.zeros(n + e, n + e, dtype=torch.bool, device=dev)
            vis[:n, :n] = tt.ancestors
            vis[n:] = to_device(draft.extra_visibility, dev)
        return ids, cache_len + depths, self._mask(vis, depths, cache_len)

    def _forward(self, cache, cache_len: int, ids, pos, mask, hidden: bool):
        if self.compiled is not None:
            return self.compiled.rows(cache, cache_len, ids, pos, mask, hidden)
        out = self.model(
            input_ids=ids[None], position_ids=pos[None], **with_cache(self.model, cache), use_cache=True,
            attention_mask=mask, output_hidden_states=hidden,
        )
        return out.logits[0], (out.hidden_states[-1][0] if hidden else None)

    def _verify(self, logits: torch.Tensor, draft: Draft | None, draft_ids: torch.Tensor, cache_len: int,
                select: Callable, drafter: Drafter) -> tuple[list[int], list[int], torch.Tensor | None]:
        """(accepted nodes in path order, emitted tokens = their tokens + the bonus, the path on the
        device). The only device-to-host copy of a step: the path and its tokens, one small tensor.
        `draft_ids`: the forward's input rows on the device (root first). The step's clock, where one
        runs, gets the host's part and the wait for the device apart."""
        piece = verify_piece(self.tree_tensors, logits, draft, draft_ids, cache_len, select, drafter, self.device)
        clock = self._clock
        if clock is not None:
            clock.lap("verify")
        host = piece.tolist()
        if clock is not None:
            clock.lap("wait")
        accepted, emitted = split_piece(host, draft)
        return accepted, emitted, None if draft is None else piece[: draft.tree.max_depth + 1]

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], drafter: Drafter, max_new_tokens: int,
                 sampler: Callable | None = None, measure_cache: Callable | None = None,
                 prefix: KeptPrefix | None = None) -> TurnResult:
        """Decode one turn. `sampler(logits, positions) -> tokens` replaces the argmax when sampling;
        `positions` are the absolute positions of the rows, which key its randomness.
        `measure_cache(cache) -> bytes` (run/memory.py) sizes the turn's cache once the clock stops:
        the cache lives only in here, and the run's layer is not the engine's to import.
        `prefix`: the conversation's kept cache (prefix caching); the turn prefills only what its
        prompt does not share with it, and leaves its own cache there for the next turn."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        check_context(self.context_length, max_new_tokens, self.model, len(prompt_ids))
        if prefix is not None and (reads_hidden_states(drafter) or reads_prompt_logits(drafter)):
            raise ValueError(f"{type(drafter).__name__} reads the whole prompt's hidden states or logits: "
                             "a turn on a kept prefix computes only the rest (run/plan.py refuses such runs)")
        dev = self.device
        turn = _Turn(drafter, sampler or greedy_targets, token_buffer(prompt_ids, max_new_tokens),
                     len(prompt_ids), max_new_tokens, reads_hidden_states(drafter))
        cache, reused = self._turn_cache(prefix, prompt_ids, max_new_tokens, turn.hidden)
        t0 = now(dev)
        first, out = prefill(self.model, turn.buf[reused : turn.cur], cache, turn.select, drafter, dev, start=reused)
        t_prefill = now(dev) - t0
        observe_prefill(drafter, out)
        turn.emit([first])
        self.forward_time = 0.0
        clock = self._clock = PhaseClock(t0 + t_prefill)
        try:
            while len(turn.new) < max_new_tokens and turn.new[-1] not in self.eos:
                self._step(turn, cache, clock)
        finally:
            self._clock = None
        wall = now(dev) - t0
        r = turn.result
        r.wall_time, r.prefill_time, r.forward_time, r.phase_seconds = wall, t_prefill, self.forward_time, clock.totals
        r.prefix_reused = reused
        r.kv_cache_bytes = measure_cache(cache) if measure_cache is not None else None
        if prefix is not None:  # the cache holds the rows of every decided token but the last (the next root)
            prefix.tokens, prefix.cache = turn.buf[: turn.cur - 1].tolist(), cache
        return r

    def _step(self, turn: "_Turn", cache, clock: "PhaseClock") -> None:
        """One step: propose, the forward, verification (the step's one read from the device),
        compaction, observe; each phase's host seconds on `clock`."""
        cache_len = turn.cur - 1  # the root (last decided token) is not in the cache yet
        root = turn.new[-1]
        draft = propose(turn.drafter, turn.buf, turn.cur, turn.prompt_len, turn.result.decoding_steps)
        propose_s = clock.lap("propose")
        loaded = self._load(cache, cache_len, draft, root, turn.hidden)
        load_s = clock.lap("host")
        ids, logits, hidden = self._run_forward(loaded, cache, cache_len, turn.hidden)
        forward_s = load_s + clock.lap("forward") if on_host(self.device) else None
        accepted, emitted, path = self._verify(logits, draft, ids, cache_len, turn.select, turn.drafter)
        bonus = emitted[-1]
        if draft is not None or self.compiled is not None:  # a static cache holds the padded rows too
            keep = [0] + accepted  # rows to keep, in order; on the device they are the path's head
            compact_kv_cache(cache, cache_len, keep, None if path is None else path[: len(keep)])
        emitted = cut_at_stop(emitted, self.eos, len(turn.new), turn.max_new)
        turn.emit(emitted)
        turn.record(draft, len(emitted))
        clock.lap("verify")
        turn.drafter.observe(StepOutcome(draft=draft, root=root, logits=logits, accepted=accepted, bonus=bonus,
                                         hidden_states=hidden, emitted=emitted, forward_seconds=forward_s))
        # perf_counter without a synchronisation: the step's .tolist() has waited for the device
        # already; work observe() queued lands in the next step's time, and the turn's wall time
        # (synchronised) still holds all of it
        turn.result.step_observe_times.append(clock.lap("observe"))
        turn.result.step_propose_times.append(propose_s)
        turn.result.step_times.append(clock.end_step())


@dataclass
class _Turn:
    """One turn's decoding state: the drafter, the decided tokens (`buf[:cur]`, the prompt first) and
    the result being recorded."""

    drafter: Drafter
    select: Callable
    buf: torch.Tensor
    prompt_len: int
    max_new: int
    hidden: bool
    cur: int = 0
    new: list[int] = field(default_factory=list)
    result: TurnResult = field(default_factory=lambda: TurnResult([], 0.0, 0.0, 0, []))

    def __post_init__(self):
        self.cur = self.prompt_len
        self.result.tokens = self.new

    def emit(self, tokens: list[int]) -> None:
        """Decided tokens appended: to the buffer a drafter reads and to the turn's new tokens."""
        n = len(tokens)
        if n == 1:
            self.buf[self.cur] = tokens[0]
        else:
            self.buf[self.cur : self.cur + n] = torch.tensor(tokens, dtype=torch.long)
        self.cur += n
        self.new.extend(tokens)

    def record(self, draft: Draft | None, emitted: int) -> None:
        r = self.result
        r.accept_lengths.append(emitted)
        r.step_rows.append(rows_of(draft))
        r.step_drafted.append(0 if draft is None else len(draft.tree))
        r.decoding_steps += 1

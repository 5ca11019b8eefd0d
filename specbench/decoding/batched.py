"""Batched speculative decoding: several requests, one model forward per step over all their rows.

Each request keeps what `Engine.generate` gives a turn (its prompt, drafter, sampler, budget and
accepted path); what they share is one `DynamicCache` whose batch dimension holds one slot per
request being decoded. Slot b's valid prefix is columns [0, len_b); the cache itself is as long as
the longest slot, L = max len_b, so a shorter slot has holes [len_b, L) that its rows never see.

A step appends every slot's rows (root, draft nodes, extra rows, padded to the step's widest row
count R) at columns [L, L + R), verifies each slot on its own, then moves each slot's kept rows
(root + accepted path) down to [len_b, len_b + kept) with one gather per layer and crops the cache
to the new max len_b. Requests are admitted as slots free up (continuous batching), each prefilled
alone (batch 1) and copied into its slot.

Prefill, each slot's verification and the stop at EOS or the budget are step.py's, the very functions
Engine.generate calls; what is this engine's own is the batched forward: padding, masks and the cache.

Eager forward only: the compiled forward's static cache is built for one request.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from specbench.decoding.kv_cache import with_cache
from specbench.decoding.step import (ModelFacts, TreeTensorCache, check_context, cut_at_stop, greedy_targets,
                                     observe_prefill, prefill, propose, rows_of, split_piece, token_buffer,
                                     verify_piece)
from specbench.decoding.transfers import to_device
from specbench.draft import Draft, StepOutcome
from specbench.drafter import Drafter, LearnsAcrossRequests, observe_batch, reads_hidden_states
from specbench.timing import now


@dataclass
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    drafter: Drafter | Callable[[], Drafter] | None = None  # an instance, a factory, or None (AR)
    sampler: Callable | None = None  # sampler(logits, positions) -> tokens; None: greedy
    arrival: float = 0.0  # seconds after generate() starts


class DrafterPool:
    """A request's drafter factory that reuses finished requests' drafters: a drafter serves one request
    at a time and `start_question()` separates them, as the single-request runner does between
    questions, so a heavy drafter (a draft model, heads, a datastore) is built at most max_batch times.
    What spans requests (TR's matrix) is one state for every drafter of the pool."""

    def __init__(self, build: Callable[[], Drafter]):
        self.build, self.free, self.built = build, [], []

    def __call__(self) -> Drafter:
        if self.free:
            d = self.free.pop()
            d.start_question()
            return d
        d = self.build()
        if self.built and isinstance(d, LearnsAcrossRequests):
            d.share_learned_state(self.built[0])
        self.built.append(d)
        return d

    def release(self, drafter: Drafter) -> None:
        self.free.append(drafter)


@dataclass
class RequestRecord:
    tokens: list[int] = field(default_factory=list)  # new tokens, EOS included if produced
    accept_lengths: list[int] = field(default_factory=list)
    step_rows: list[int] = field(default_factory=list)  # this request's real rows in each step
    # host seconds of each step in this request's drafter: its propose(), and its share of the
    # observe_batch() its method's requests were observed in together
    step_propose_times: list[float] = field(default_factory=list)
    step_observe_times: list[float] = field(default_factory=list)
    decoding_steps: int = 0
    arrival: float = 0.0
    admitted: float = 0.0  # prefill start; all times in seconds since generate() started
    first_token: float = 0.0
    finished: float = 0.0
    slot: int = -1  # the batch row it was admitted to (-1: finished by its prefill); rows shift down
    # when free ones are dropped


@dataclass
class BatchStep:
    rows: int  # rows the forward computed: slots x the widest slot's rows, padding included
    real_rows: int  # rows that belong to a request
    active: int  # requests in the forward
    time: float  # wall seconds of the step
    context: int = 0  # the cache's length before the step: every slot's rows attend over this many columns


@dataclass
class BatchResult:
    records: list[RequestRecord]  # in the order the requests were given
    steps: list[BatchStep]
    wall_time: float


@dataclass
class _Slot:
    """A request being decoded."""

    request: Request
    drafter: Drafter
    select: Callable
    buf: torch.Tensor  # prompt + output on the host, as DecodeState wants it
    cur: int
    record: RequestRecord
    key: int  # the request's index: what a speculation policy keys its estimates by


class BatchedEngine:
    def __init__(self, model, eos_token_ids: list[int]):
        self.model = model.eval()
        self.device = model.device
        self.eos = frozenset(int(e) for e in eos_token_ids)
        self.facts = ModelFacts.of(model)
        self.tree_tensors = TreeTensorCache(self.device)

    @torch.inference_mode()
    def generate(self, requests: list[Request], max_batch: int, policy=None) -> BatchResult:
        """Decode `requests`, at most `max_batch` at once, each admitted once its arrival time has passed.
        `policy` (speculation/batch_policy.py) may cut each step's drafts to sub-trees; None keeps them whole."""
        self.policy = policy
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        drafters = [r.drafter for r in requests if isinstance(r.drafter, Drafter)]
        if len({id(d) for d in drafters}) != len(drafters):
            raise ValueError("two requests share one drafter instance; give each its own (or a factory)")
        for r in requests:
            if r.max_new_tokens < 1:
                raise ValueError(f"max_new_tokens must be at least 1, got {r.max_new_tokens}")
            check_context(self.facts.context_length, r.max_new_tokens, self.model, len(r.prompt_ids))
        records = [RequestRecord(arrival=r.arrival) for r in requests]
        waiting = deque(sorted(range(len(requests)), key=lambda i: requests[i].arrival))
        # slot b: self.slots[b] (None: free) with valid length self.lens[b]; the cache's batch row b
        self.cache, self.slots, self.lens = None, [], []
        steps: list[BatchStep] = []
        t0 = now(self.device)
        while True:
            # a finished request's slot goes to the next arrived request before the next step
            # (arrivals against the host clock: no device synchronisation needed to compare them)
            while (waiting and sum(s is not None for s in self.slots) < max_batch
                   and requests[waiting[0]].arrival <= time.perf_counter() - t0):
                i = waiting.popleft()
                self._admit(requests[i], records[i], t0, i)
            if None in self.slots:  # nobody to take them: free rows would cost every step
                self._drop_free_slots()
            if not self.slots:
                if not waiting:
                    break
                time.sleep(max(0.0, requests[waiting[0]].arrival - (time.perf_counter() - t0)))
                continue
            steps.append(self._step())
            if self.policy is not None:
                last = steps[-1]
                self.policy.observe_step(last.active, last.rows // last.active, last.time, last.context)
            for b, s in enumerate(self.slots):
                if self._done(s):
                    s.record.finished = now(self.device) - t0
                    self.slots[b] = None
                    self._release(s.request, s.drafter)
                    if self.policy is not None:
                        self.policy.forget(s.key)
        return BatchResult(records=records, steps=steps, wall_time=now(self.device) - t0)

    @staticmethod
    def _release(request: Request, drafter: Drafter) -> None:
        """A finished request's drafter back to its pool (DrafterPool), if it came from one."""
        if isinstance(request.drafter, DrafterPool):
            request.drafter.release(drafter)

    def _done(self, s: _Slot) -> bool:
        return len(s.record.tokens) >= s.request.max_new_tokens or s.record.tokens[-1] in self.eos

    # -- admission: prefill alone, then copy the prompt's KV into a slot --------------------------------

    def _admit(self, request: Request, record: RequestRecord, t0: float, key: int) -> None:
        d = request.drafter
        drafter = d if isinstance(d, Drafter) else (d() if d is not None else Drafter())
        select = request.sampler or greedy_targets
        n = len(request.prompt_ids)
        buf = token_buffer(request.prompt_ids, request.max_new_tokens)

        record.admitted = now(self.device) - t0
        own = DynamicCache()
        first, out = prefill(self.model, buf[:n], own, select, drafter, self.device)
        observe_prefill(drafter, out)
        record.first_token = now(self.device) - t0
        buf[n] = first
        record.tokens.append(first)
        slot = _Slot(request, drafter, select, buf, n + 1, record, key)
        if self._done(slot):  # EOS or a budget of one: decided by the prefill alone
            record.finished = record.first_token
            self._release(request, drafter)
            return
        b = self.slots.index(None) if None in self.slots else len(self.slots)
        self._place(own, n, b)
        record.slot = b
        if b == len(self.slots):
            self.slots.append(slot)
            self.lens.append(n)
        else:
            self.slots[b], self.lens[b] = slot, n

    def _place(self, own: DynamicCache, n: int, b: int) -> None:
        """Copy a prompt's n prefilled rows (batch-1 cache `own`) into batch row b, growing the cache
        by a row (b == its batch size) or by columns (a prompt longer than the cache) when needed.
        A reused row keeps its last request's rows past n: finite, and masked as holes."""
        if self.cache is None:
            self.cache = own  # the first slot is the prompt's own cache
            return
        for mine, theirs in zip(self.cache.layers, own.layers):
            for name in ("keys", "values"):
                big, new = getattr(mine, name), getattr(theirs, name)
                rows, heads, cols, dim = big.shape
                if b == rows or n > cols:
                    # zeros, not empty: a hole's weight is exactly 0 after the softmax, but 0 * NaN is not
                    grown = big.new_zeros(max(rows, b + 1), heads, max(cols, n), dim)
                    grown[:rows, :, :cols] = big
                    big = grown
                big[b, :, :n] = new[0]
                setattr(mine, name, big)

    def _drop_free_slots(self) -> None:
        keep = [b for b, s in enumerate(self.slots) if s is not None]
        self.slots = [self.slots[b] for b in keep]
        self.lens = [self.lens[b] for b in keep]
        if not keep:
            self.cache = None
            return
        idx, top = to_device(keep, self.device, torch.long), max(self.lens)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[..., :top, :]
            layer.values = layer.values.index_select(0, idx)[..., :top, :]

    # -- one batched step --------------------------------------------------------------------------------

    def _step(self) -> BatchStep:
        t_start = time.perf_counter()
        slots, lens = self.slots, self.lens
        B, L = len(slots), self.cache.get_seq_length()
        drafts, propose_times = self._propose(L)
        n_rows = [rows_of(d) for d in drafts]
        roots = [s.record.tokens[-1] for s in slots]
        ids, pos, vis = self._inputs(drafts, roots, max(n_rows))
        want_hidden = any(reads_hidden_states(s.drafter) for s in slots)
        out = self.model(input_ids=ids, position_ids=pos, **with_cache(self.model, self.cache), use_cache=True,
                         attention_mask=self._mask(pos[:, 0], pos, vis, L), output_hidden_states=want_hidden)

        # Verify each slot on its own rows; every slot's path and tokens come back in one copy.
        pieces = [verify_piece(self.tree_tensors, out.logits[b, : n_rows[b]], draft, ids[b], lens[b], s.select,
                               s.drafter, self.device) for b, (s, draft) in enumerate(zip(slots, drafts))]
        host = torch.cat(pieces).tolist()  # the step's one device-to-host copy
        verified, at = [], 0
        for draft, piece in zip(drafts, pieces):
            verified.append(split_piece(host[at : at + piece.numel()], draft))
            at += piece.numel()

        self._compact(L, [accepted for accepted, _ in verified])
        outcomes = []
        for b, (s, draft, (accepted, emitted)) in enumerate(zip(slots, drafts, verified)):
            emitted = self._emit(s, emitted, n_rows[b], propose_times[b])
            if self.policy is not None:
                self.policy.observe(s.key, draft, accepted, emitted)
            hidden = out.hidden_states[-1][b, : n_rows[b]] if reads_hidden_states(s.drafter) else None
            outcomes.append(StepOutcome(draft=draft, root=roots[b], logits=out.logits[b, : n_rows[b]],
                                        accepted=accepted, bonus=verified[b][1][-1], hidden_states=hidden,
                                        emitted=emitted))
        self._observe(outcomes)
        # perf_counter without a sync: the .tolist() above has waited for the forward already
        R = max(n_rows)
        return BatchStep(rows=B * R, real_rows=sum(n_rows), active=B, time=time.perf_counter() - t_start, context=L)

    def _propose(self, L: int) -> tuple[list[Draft | None], list[float]]:
        """Each slot's draft (all None when the policy wants none this step, without asking the
        drafters), as the policy cuts them, and each drafter's propose() seconds."""
        slots = self.slots
        drafts: list[Draft | None] = [None] * len(slots)
        times = [0.0] * len(slots)
        if self.policy is None or self.policy.wants_drafts():
            for b, s in enumerate(slots):
                t = time.perf_counter()
                drafts[b] = propose(s.drafter, s.buf, s.cur, len(s.request.prompt_ids), s.record.decoding_steps)
                times[b] = time.perf_counter() - t
            if self.policy is not None:
                drafts = self.policy.choose(drafts, [s.key for s in slots], L)
        return drafts, times

    def _inputs(self, drafts: list[Draft | None], roots: list[int], R: int):
        """(ids, positions, visibility) of the step's rows, (B, R), (B, R), (B, R, R), on the device.
        Rows past a slot's own count are padding: token 0 at the root's position, seeing the prefix
        and itself like a root would (so its softmax is finite); no row sees a padding row."""
        dev, B = self.device, len(drafts)
        ids = torch.zeros(B, R, dtype=torch.long, device=dev)
        ids[:, 0] = to_device(roots, dev, torch.long)  # the host sends the roots
        depths = torch.zeros(B, R, dtype=torch.long, device=dev)
        vis = torch.eye(R, dtype=torch.bool, device=dev).repeat(B, 1, 1)
        for b, draft in enumerate(drafts):
            if draft is None:
                continue
            tt, n = self.tree_tensors(draft.tree), draft.tree.size
            ids[b, 1:n] = to_device(draft.tokens, dev)
            depths[b, :n] = tt.depths
            vis[b, :n, :n] = tt.ancestors
            if draft.n_extra:  # extra rows see what the drafter says; tree rows never see them
                e = n + draft.n_extra
                ids[b, n:e] = to_device(draft.extra_tokens, dev)
                depths[b, n:e] = to_device(draft.extra_depths, dev)
                vis[b, n:e, :e] = to_device(draft.extra_visibility, dev)
        pos = to_device(self.lens, dev, torch.long)[:, None] + depths
        return ids, pos, vis

    def _emit(self, s: _Slot, emitted: list[int], rows: int, propose_seconds: float) -> list[int]:
        """A slot's verified tokens cut at its stop, appended to its sequence and record; returns them."""
        new = s.record.tokens
        emitted = cut_at_stop(emitted, self.eos, len(new), s.request.max_new_tokens)
        s.buf[s.cur : s.cur + len(emitted)] = torch.tensor(emitted, dtype=torch.long)
        s.cur += len(emitted)
        new.extend(emitted)
        s.record.accept_lengths.append(len(emitted))
        s.record.step_rows.append(rows)
        s.record.step_propose_times.append(propose_seconds)
        s.record.decoding_steps += 1
        return emitted

    def _observe(self, outcomes: list[StepOutcome]) -> None:
        """Each method learns from its requests' outcomes at once (observe_batch); each request's
        record gets its share of that call's seconds."""
        by_method: dict[type, list[int]] = {}
        for b, s in enumerate(self.slots):
            by_method.setdefault(type(s.drafter), []).append(b)
        for members in by_method.values():
            t = time.perf_counter()
            observe_batch([self.slots[b].drafter for b in members], [outcomes[b] for b in members])
            share = (time.perf_counter() - t) / len(members)
            for b in members:
                self.slots[b].record.step_observe_times.append(share)

    def _mask(self, lens: torch.Tensor, pos: torch.Tensor, vis: torch.Tensor, L: int):
        """(B, 1, R, L + R) additive mask: slot b's rows see its prefix [0, len_b) (not its holes) and,
        among the new columns, what `vis` allows; a dict per layer type on sliding-window models."""
        B, R = pos.shape
        cols = torch.arange(L, device=lens.device)
        allowed = torch.empty(B, R, L + R, dtype=torch.bool, device=lens.device)
        allowed[:, :, :L] = cols[None, None, :] < lens[:, None, None]
        allowed[:, :, L:] = vis

        def additive(ok: torch.Tensor) -> torch.Tensor:
            dtype = self.facts.mask_dtype
            return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill_(~ok, torch.finfo(dtype).min)[:, None]

        window = self.facts.sliding_window
        if window is None:
            return additive(allowed)
        sliding = allowed.clone()  # a prefix column j holds position j in every slot
        sliding[:, :, :L] &= cols[None, None, :] > pos[:, :, None] - window
        return {"full_attention": additive(allowed), "sliding_attention": additive(sliding)}

    def _compact(self, L: int, accepted: list[list[int]]) -> None:
        """Move each slot's root and accepted rows from [L, L + R) to [len_b, ...), then crop."""
        batch, src, dst = [], [], []
        for b, acc in enumerate(accepted):
            keep = [0] + acc
            batch += [b] * len(keep)
            src += [L + r for r in keep]
            dst += range(self.lens[b], self.lens[b] + len(keep))
            self.lens[b] += len(keep)
        if src != dst:  # else every slot's rows are in place already: a crop is enough
            idx = to_device([batch, src, dst], self.device, torch.long)
            for layer in self.cache.layers:
                # the gather copies before the scatter writes, so overlapping rows are safe; the layer
                # owns its tensors (every update concatenates into a new one), so writing is too
                layer.keys[idx[0], :, idx[2]] = layer.keys[idx[0], :, idx[1]]
                layer.values[idx[0], :, idx[2]] = layer.values[idx[0], :, idx[1]]
        top = max(self.lens)
        for layer in self.cache.layers:
            layer.keys = layer.keys[..., :top, :]
            layer.values = layer.values[..., :top, :]

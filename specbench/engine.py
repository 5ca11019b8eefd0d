"""The decoding loop: prefill, then draft -> one tree forward -> verify -> compact KV -> observe.

Batch size 1. The engine knows nothing of any method: a drafter hands it a `Draft` (or None for a
plain step) and gets a `StepOutcome` back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from specbench.drafter import DecodeState, Draft, Drafter, StepOutcome
from specbench.kv_cache import compact_kv_cache
from specbench.timing import now
from specbench.tree import DraftTree, tree_attention_mask
from specbench.verify import accept_path

_NO_DRAFT = DraftTree(())


@dataclass
class TurnResult:
    tokens: list[int]  # new tokens, EOS included if produced
    wall_time: float  # prefill + decoding, device-synchronised
    prefill_time: float
    decoding_steps: int
    accept_lengths: list[int]  # per step: accepted draft tokens + 1 (the bonus)
    forward_time: float = 0.0  # time inside model forwards during decoding (profile=True only)
    step_rows: list[int] = field(default_factory=list)  # rows per verification forward

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)


def greedy_targets(logits: torch.Tensor, positions: torch.Tensor) -> list[int]:
    """The target's choice at every row: the argmax (positions are unused in greedy decoding)."""
    return logits.argmax(dim=-1).tolist()


class Engine:
    def __init__(self, model, eos_token_ids: list[int], profile: bool = False):
        self.model = model.eval()
        self.device = model.device
        self.eos = set(int(e) for e in eos_token_ids)
        self.profile = profile
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        layer_types = getattr(cfg, "layer_types", None) or []
        window = getattr(cfg, "sliding_window", None)
        # Models that mix sliding and full layers take one mask per layer type.
        self.sliding_window = window if window and "sliding_attention" in layer_types else None
        self.mask_dtype = model.dtype
        self.forward_time = 0.0

    def _mask(self, visibility, depths, cache_len):
        full = tree_attention_mask(visibility, depths, cache_len, self.mask_dtype, self.device)
        if self.sliding_window is None:
            return full
        sliding = tree_attention_mask(
            visibility, depths, cache_len, self.mask_dtype, self.device, self.sliding_window
        )
        return {"full_attention": full, "sliding_attention": sliding}

    @torch.inference_mode()
    def forward_rows(self, cache, cache_len: int, draft: Draft | None, root: int, hidden: bool = False):
        """One verification forward over root + draft rows (+ extra rows). Returns logits, hidden."""
        mask = None
        if draft is None:
            ids = torch.tensor([[root]], device=self.device)
            pos = torch.tensor([[cache_len]], device=self.device)
        else:
            tree = draft.tree
            tokens = [torch.tensor([root]), draft.tokens.cpu()]
            depths = tree.depths
            vis = tree.ancestor_mask
            if draft.n_extra:
                n, e = tree.size, draft.n_extra
                tokens.append(draft.extra_tokens.cpu())
                depths = torch.cat([depths, draft.extra_depths.cpu()])
                full = torch.zeros(n + e, n + e, dtype=torch.bool)
                full[:n, :n] = vis
                full[n:] = draft.extra_visibility.cpu()
                vis = full
            ids = torch.cat(tokens)[None].to(self.device)
            pos = (cache_len + depths)[None].to(self.device)
            mask = self._mask(vis, depths, cache_len)
        t0 = now(self.device) if self.profile else 0.0
        out = self.model(
            input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True,
            attention_mask=mask, output_hidden_states=hidden,
        )
        hs = out.hidden_states[-1][0] if hidden else None
        if self.profile:
            self.forward_time += now(self.device) - t0
        return out.logits[0], hs

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], drafter: Drafter, max_new_tokens: int,
                 sampler: Callable | None = None) -> TurnResult:
        """Decode one turn. `sampler(logits, positions) -> tokens` replaces the argmax when sampling;
        `positions` are the absolute positions of the rows, which key its randomness."""
        select = sampler or greedy_targets
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        dev = self.device
        want_hidden = drafter.needs_hidden_states
        buf = torch.empty(len(prompt_ids) + max_new_tokens + 1, dtype=torch.long)
        buf[: len(prompt_ids)] = torch.tensor(prompt_ids, dtype=torch.long)
        cur = len(prompt_ids)

        t0 = now(dev)
        cache = DynamicCache()
        out = self.model(
            input_ids=buf[:cur][None].to(dev), past_key_values=cache, use_cache=True,
            logits_to_keep=1, output_hidden_states=want_hidden,
        )
        first = select(out.logits[0, -1:], torch.tensor([cur - 1]))[0]
        t_prefill = now(dev) - t0
        if want_hidden:
            drafter.observe_prefill(out.hidden_states[-1][0, -1:])
        buf[cur] = first
        cur += 1
        new = [first]
        accept_lengths: list[int] = []
        rows_per_step: list[int] = []
        self.forward_time = 0.0
        step = 0
        while len(new) < max_new_tokens and new[-1] not in self.eos:
            cache_len = cur - 1  # the root (last decided token) is not in the cache yet
            root = new[-1]
            draft = drafter.propose(DecodeState(tokens=buf[:cur], prompt_len=len(prompt_ids), step=step))
            if draft is not None and len(draft.tree) == 0:
                draft = None
            logits, hidden = self.forward_rows(cache, cache_len, draft, root, want_hidden)
            tree = _NO_DRAFT if draft is None else draft.tree
            positions = cache_len + tree.depths
            targets = select(logits[: tree.size], positions)
            draft_list = [] if draft is None else draft.tokens.tolist()
            accepted, bonus = accept_path(tree, draft_list, targets)
            if draft is not None:
                compact_kv_cache(cache, cache_len, [0] + accepted)
            emitted = [draft_list[a - 1] for a in accepted] + [bonus]
            for i, tok in enumerate(emitted):  # stop at EOS or the budget, whichever comes first
                if tok in self.eos or len(new) + i + 1 >= max_new_tokens:
                    emitted = emitted[: i + 1]
                    break
            buf[cur : cur + len(emitted)] = torch.tensor(emitted, dtype=torch.long)
            cur += len(emitted)
            new.extend(emitted)
            accept_lengths.append(len(emitted))
            rows_per_step.append(tree.size + (draft.n_extra if draft is not None else 0))
            drafter.observe(
                StepOutcome(draft=draft, root=root, logits=logits, accepted=accepted, bonus=bonus,
                            hidden_states=hidden, emitted=emitted)
            )
            step += 1
        wall = now(dev) - t0
        return TurnResult(
            tokens=new, wall_time=wall, prefill_time=t_prefill, decoding_steps=step,
            accept_lengths=accept_lengths, forward_time=self.forward_time, step_rows=rows_per_step,
        )

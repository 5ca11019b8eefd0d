"""The pieces of a decoding step that the single-request engine (engine.py) and the batched engine
(batched.py) share: prefill of one prompt, verification of one request's rows, the split of the
copied-back result into accepted nodes and emitted tokens, and the stop at EOS or the budget.

Both engines call these, so a request decoded in a batch goes through the same prefill, acceptance
rule and stop as one decoded alone, and it emits the same tokens by construction, not by keeping two
copies in step.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Callable

import torch

from specbench.decoding.kv_cache import with_cache
from specbench.decoding.transfers import on_host
from specbench.decoding.verify import TreeTensors, accepted_path, row_argmax, walk_path
from specbench.draft import DecodeState, Draft, DraftTree
from specbench.drafter import Drafter, OverridesTargets, reads_hidden_states, reads_prompt_logits
from specbench.errors import InputError
from specbench.numerics import NonFiniteError, non_finite_message


# -- the model ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelFacts:
    """What the decoding loop needs from a model's config: how to build its masks and how far it reaches."""

    sliding_window: int | None  # set only when sliding and full layers mix: they take one mask per type
    mask_dtype: torch.dtype
    context_length: int | None  # positions the model was trained for (None: unknown)

    @classmethod
    def of(cls, model) -> "ModelFacts":
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        layer_types = getattr(cfg, "layer_types", None) or []
        window = getattr(cfg, "sliding_window", None)
        return cls(sliding_window=window if window and "sliding_attention" in layer_types else None,
                   mask_dtype=model.dtype, context_length=getattr(cfg, "max_position_embeddings", None))


def check_context(context_length: int | None, max_new_tokens: int, model=None, prompt_len: int = 1) -> None:
    """InputError unless the prompt and `max_new_tokens` fit the model's context. The runners refuse
    such a prompt before anything is timed (inputs/window.py); this is the backstop for
    whatever reaches an engine otherwise."""
    if not context_length or max(prompt_len, 1) + max_new_tokens <= context_length:
        return
    from specbench.numerics import model_label

    name = model_label(model) if model is not None else ""
    if max_new_tokens >= context_length:  # too many whatever the prompt: as the settings' check says it
        raise InputError(f"max_new_tokens={max_new_tokens} is beyond the context of model {name} ({context_length} "
                         f"positions, prompt included); set max_new_tokens below {context_length}")
    fix = (f"set max_new_tokens to at most {context_length - prompt_len} or shorten the prompt"
           if prompt_len < context_length else "shorten the prompt")
    raise InputError(f"a prompt of {prompt_len} tokens and max_new_tokens={max_new_tokens} need "
                     f"{prompt_len + max_new_tokens} positions, beyond the context of model {name} "
                     f"({context_length} positions); {fix}")


class TreeTensorCache:
    """`TreeTensors` per draft tree, made once per tree: drafters reuse their trees step after step.
    Weak keys, so the trees a drafter makes afresh every step (REST, Lookahead) do not pile up."""

    def __init__(self, device: torch.device | str):
        self.device = device
        self._trees: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, tree: DraftTree) -> TreeTensors:
        tt = self._trees.get(tree)
        if tt is None:
            tt = self._trees[tree] = TreeTensors(tree, self.device)
        return tt


# -- prefill -----------------------------------------------------------------------------------------

def greedy_targets(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The target's choice at every row: the argmax (positions are unused in greedy decoding)."""
    return row_argmax(logits)


def first_token(choice, last_logits: torch.Tensor, model, prompt) -> int:
    """The prefill's chosen token, read to the host in one copy with whether the last row's logits are
    all finite (no synchronisation more than the choice alone): NaN/inf stops the run in one line
    naming the model, the dtype and the first layer that overflowed (numerics.py)."""
    choice = torch.as_tensor(choice).reshape(-1)[:1].long()
    finite = torch.isfinite(last_logits).all().to(device=choice.device, dtype=torch.long).reshape(1)
    token, ok = torch.cat([choice, finite]).tolist()
    if not ok:
        raise NonFiniteError(non_finite_message(model, prompt))
    return int(token)


def token_buffer(prompt_ids: list[int], max_new_tokens: int) -> torch.Tensor:
    """(len(prompt_ids) + max_new_tokens + 1,) long on the host, the prompt at its head: the decided
    sequence a drafter reads (DecodeState.tokens), with room for a step's overshoot past the budget."""
    buf = torch.empty(len(prompt_ids) + max_new_tokens + 1, dtype=torch.long)
    buf[: len(prompt_ids)] = torch.tensor(prompt_ids, dtype=torch.long)
    return buf


def prefill(model, prompt: torch.Tensor, cache, select: Callable, drafter: Drafter, device, start: int = 0):
    """Run the prompt through `model` into `cache` (batch 1) and choose the first new token.

    prompt: (n,) long on the host; `start`: the prompt tokens before it, whose rows `cache` holds
    already (a kept prefix: then the drafter may not want the prompt's logits, engine.generate).
    Returns (first token, the model's output), whose `hidden_states` are there when the drafter wants
    them (observe_prefill). A drafter that wants the prompt's logits gets them here (observe_prompt):
    the earlier rows' from their hidden states (post-norm) through the output head, so the last row,
    which chose the first token, stays exactly the one plain decoding computes (logits_to_keep=1)."""
    n = prompt.shape[0]
    want_prompt = reads_prompt_logits(drafter)
    out = model(input_ids=prompt[None].to(device), **with_cache(model, cache), use_cache=True,
                logits_to_keep=1, output_hidden_states=reads_hidden_states(drafter) or want_prompt)
    first = first_token(select(out.logits[0, -1:], torch.full((1,), start + n - 1)), out.logits[0, -1], model, prompt)
    if want_prompt:
        head = model.get_output_embeddings()
        drafter.observe_prompt(prompt, torch.cat([head(out.hidden_states[-1][0, :-1]), out.logits[0, -1:]]))
    return first, out


def observe_prefill(drafter: Drafter, out) -> None:
    """The prompt's last-layer hidden states, (n, hidden), to a drafter that wants them. Apart from
    prefill() because the engines time it differently: Engine's prefill time leaves it to the first
    step, the batched engine's first-token time holds it."""
    if reads_hidden_states(drafter):
        drafter.observe_prefill(out.hidden_states[-1][0])


# -- one step ----------------------------------------------------------------------------------------

# A step's phases, as the engines time them on the host: the drafter's propose(); the host's work before
# the forward (rows into buffers or tensors, masks); the forward (on CUDA its launch, or a graph's
# replay, queued); verification and compaction's host work (the read's wait apart); the wait for the
# device at the step's one read; the drafter's observe().
PHASES = ("propose", "host", "forward", "verify", "wait", "observe")


class PhaseClock:
    """Host seconds per phase, summed over steps: `lap(phase)` adds the time since the last lap (or
    the step's start) to `phase` and returns it; `end_step()` returns the step's whole time. Laps are
    back to back, so the phases of a step add up to its time."""

    def __init__(self, start: float):
        self.totals = dict.fromkeys(PHASES, 0.0)
        self._t = self._step_start = start

    def lap(self, phase: str) -> float:
        t = time.perf_counter()
        d, self._t = t - self._t, t
        self.totals[phase] += d
        return d

    def end_step(self) -> float:
        d, self._step_start = self._t - self._step_start, self._t
        return d


def propose(drafter: Drafter, buf: torch.Tensor, cur: int, prompt_len: int, step: int) -> Draft | None:
    """The drafter's draft for the sequence buf[:cur], or None for a plain step (an empty tree is one)."""
    draft = drafter.propose(DecodeState(tokens=buf[:cur], prompt_len=prompt_len, step=step))
    return None if draft is not None and len(draft.tree) == 0 else draft


def rows_of(draft: Draft | None) -> int:
    """Rows a request puts in a verification forward: the root, the tree's nodes, the extra rows."""
    return 1 if draft is None else draft.tree.size + draft.n_extra


def verify_piece(tree_tensors: Callable[[DraftTree], TreeTensors], logits: torch.Tensor, draft: Draft | None,
                 rows: torch.Tensor, base_position: int, select: Callable, drafter: Drafter,
                 device) -> torch.Tensor:
    """One request's verification, left on the device for the step's one copy to the host (on a CPU, the
    tree walked and only the reached rows' targets chosen: `walked_piece`).

    logits: (R, vocab), the request's rows of the forward (root first); rows: (R,) its input ids;
    base_position: the root's absolute position (the cache's length before the step).
    Returns, for a plain step (draft None), (1,): the target's token at the root; else
    (2 * (max_depth + 1),): the accepted node at each depth (0 past the path's end, accepted_path),
    then the target's token at each of those nodes. An accepted node's token is its parent's target,
    so the emitted tokens are the targets along [root] + path (split_piece reads them)."""
    if draft is None:
        targets = torch.as_tensor(select(logits[:1], torch.full((1,), base_position)), device=device)
        return targets[:1]
    size = draft.tree.size
    # host positions: a sampler keys its noise by them without reading anything from the device
    positions = base_position + draft.tree.depths
    overrides = not drafter.lossless and isinstance(drafter, OverridesTargets)
    if on_host(logits.device) and not overrides:
        return walked_piece(draft, rows[1:size].tolist(),
                            lambda v: int(select(logits[v : v + 1], positions[v : v + 1])[0]))
    targets = torch.as_tensor(select(logits[:size], positions), device=device)
    if overrides:
        targets = drafter.override_targets(draft, logits[:size], targets)
    path = accepted_path(tree_tensors(draft.tree), rows[1:size], targets)
    return torch.cat([path, targets[path]])


def walked_piece(draft: Draft, draft_tokens: list[int], target_at: Callable[[int], int]) -> torch.Tensor:
    """`verify_piece`'s result on a CPU, where nothing waits on a device: the tree walked from the root
    (`walk_path`), each row's target chosen only when the walk reaches it, so a step pays the argmax or
    sample of its accepted path's rows, not of every row it verified. The same layout and values as
    the device's piece (past the path's end, node 0 and the root's target)."""
    accepted, targets = walk_path(draft.tree, draft_tokens, target_at)
    depth = draft.tree.max_depth + 1
    path = [0, *accepted] + [0] * (depth - 1 - len(accepted))
    return torch.tensor(path + targets + targets[:1] * (depth - len(targets)))


def split_piece(host: list[int], draft: Draft | None) -> tuple[list[int], list[int]]:
    """A `verify_piece` result read to the host -> (accepted nodes in path order, emitted tokens: the
    accepted nodes' tokens, then the bonus)."""
    if draft is None:
        return [], host[:1]
    depth = draft.tree.max_depth + 1
    accepted = [a for a in host[1:depth] if a]
    return accepted, host[depth : depth + len(accepted) + 1]


def cut_at_stop(emitted: list[int], eos, produced: int, budget: int) -> list[int]:
    """`emitted` up to and including the first EOS or the token that fills the budget, whichever comes
    first; `produced`: the request's new tokens before this step."""
    for i, tok in enumerate(emitted):
        if tok in eos or produced + i + 1 >= budget:
            return emitted[: i + 1]
    return emitted

"""Prompt Lookup Decoding (apoorvumang/prompt-lookup-decoding), with Spec-Bench's settings.

The query is the last n tokens of prompt + output (n = max_ngram_size down to 1); the earliest
earlier occurrence whose following num_pred_tokens tokens all lie inside the sequence wins, and
those tokens are drafted as one chain. No match: a plain autoregressive step (no dummy token).

Matching is vectorised: for each n, n shifted equality tests over the sequence (torch), then the
first hit; no Python loop over positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.draft import DecodeState, Draft
from specbench.drafter import Drafter
from specbench.errors import SettingsError
from specbench.registry import register
from specbench.draft import DraftTree


def find_candidate(seq: torch.Tensor, max_ngram_size: int = 3, num_pred_tokens: int = 10) -> torch.Tensor | None:
    """The reference `find_candidate_pred_tokens` on a 1-D sequence, or None when nothing matches."""
    match = find_match(seq, max_ngram_size, num_pred_tokens)
    return None if match is None else match[0]


def find_match(seq: torch.Tensor, max_ngram_size: int = 3, num_pred_tokens: int = 10) -> tuple[torch.Tensor, int] | None:
    """(the tokens that followed the match, the matched n-gram's size n), or None.

    As in the reference (and Spec-Bench), a window at index i qualifies when
    i + n + num_pred_tokens <= len(seq) and i + n < len(seq) - n (not the query itself)."""
    length = seq.numel()
    for n in range(min(max_ngram_size, length - 1), 0, -1):
        last = min(length - n - num_pred_tokens, length - 2 * n - 1)  # last admissible window
        if last < 0:
            continue
        hit = seq[: last + 1] == seq[length - n]
        for j in range(1, n):
            hit &= seq[j : last + 1 + j] == seq[length - n + j]
        idx = int(hit.to(torch.uint8).argmax())
        if hit[idx]:
            start = idx + n
            return seq[start : start + num_pred_tokens], n
    return None


@dataclass
class PLDSettings:
    max_ngram_size: int = 3  # query n-gram sizes tried, from this down to 1
    num_pred_tokens: int = 10  # tokens drafted after the match

    def __post_init__(self):
        if self.max_ngram_size < 1 or self.num_pred_tokens < 1:
            raise SettingsError(f"PLD needs method.max_ngram_size >= 1 and method.num_pred_tokens >= 1, "
                                f"got {self.max_ngram_size} and {self.num_pred_tokens}")


@register("pld")
class PromptLookup(Drafter):
    Settings = PLDSettings

    def __init__(self, target=None, settings: PLDSettings | None = None, **values):
        super().__init__(target, settings, **values)
        s = self.settings
        self.max_ngram_size = int(s.max_ngram_size)
        self.num_pred_tokens = int(s.num_pred_tokens)

    def propose(self, state: DecodeState) -> Draft | None:
        cand = find_candidate(state.tokens, self.max_ngram_size, self.num_pred_tokens)
        if cand is None:
            return None
        return Draft(tokens=cand.clone(), tree=DraftTree.chain(cand.numel()))

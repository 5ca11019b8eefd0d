"""Prompt Lookup Decoding (apoorvumang/prompt-lookup-decoding), with Spec-Bench's settings.

The query is the last n tokens of prompt + output (n = max_ngram_size down to 1); the tokens that
followed its earliest earlier occurrence are drafted as one chain (the search: drafting/ngram.py).
No match: a plain autoregressive step (no dummy token).
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.decoding.transfers import on_host
from specbench.draft import DecodeState, Draft, DraftTree
from specbench.drafter import Drafter
from specbench.drafting.ngram import check_ngram, find_candidate
from specbench.drafting.row_summary import kernel_ready
from specbench.registry import register


@dataclass
class PLDSettings:
    max_ngram_size: int = 3  # query n-gram sizes tried, from this down to 1
    num_pred_tokens: int = 10  # tokens drafted after the match

    def __post_init__(self):
        check_ngram(self.max_ngram_size, self.num_pred_tokens)


@register("pld")
class PromptLookup(Drafter):
    Settings = PLDSettings

    def __init__(self, target=None, settings: PLDSettings | None = None, **values):
        super().__init__(target, settings, **values)
        # on a CPU target the search runs in our kernel, built now, before anything is timed (an
        # accelerator's host builds nothing for it: numpy's search, the same matches)
        self._kernel = on_host(self.target.device) and kernel_ready()

    def propose(self, state: DecodeState) -> Draft | None:
        cand = find_candidate(state.tokens, self.settings.max_ngram_size, self.settings.num_pred_tokens, self._kernel)
        if cand is None:
            return None
        return Draft(tokens=cand.clone(), tree=DraftTree.chain(cand.numel()))

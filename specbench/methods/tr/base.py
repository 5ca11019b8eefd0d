"""Token Recycling (arXiv 2408.08696): draft from an adjacency matrix of recycled top-k tokens.

After every verification forward, the top-k tokens the model predicted at each row overwrite the
matrix row of that row's token. Drafting expands a static tree template from the root: the r-th
child of a node is rank r of its token's row. The matrix survives across questions (hot start).

Ablations (each a method.<name>= setting): `update=accepted` writes only the rows on the accepted
path (the root's and the accepted nodes'); `prefill_update=true` also writes a row for every prompt
token from the prefill's logits; `cold_start`, `k` and `tree` as named. Every run counts where in
the template acceptance happens (specbench/drafting/recycling_statistics.py). The matrix, its
template and its learning are the drafting library's (specbench/drafting/recycling.py).

`tr_adaptive` drafts, each step, the sub-tree of the template that the hardware's cost curve and
running acceptance estimates say is worth its forward (possibly none); the chooser's math is in
specbench/speculation/goodput.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.draft import DecodeState, Draft, StepOutcome
from specbench.drafter import Drafter, LearnsAcrossRequests, ReadsPromptLogits
from specbench.drafting.recycling import Recycling, RecyclingSettings, observe_batch
from specbench.registry import register


@dataclass
class TRSettings(RecyclingSettings):
    """The matrix's settings (k, tree, cold_start, update, prefill_update), as the paper runs them."""


@register("tr")
class TokenRecycling(Drafter, ReadsPromptLogits, LearnsAcrossRequests):
    """Drafts the whole template each step; subclasses choose a part of it (`_drafted`)."""

    Settings = TRSettings

    def __init__(self, target=None, settings: TRSettings | None = None, **values):
        super().__init__(target, settings, **values)
        self.reads_prompt_logits = bool(self.settings.prefill_update)
        self.source = Recycling(self.settings, self.target.vocab_size, self.target.device, self._confidences())
        self._drafted: tuple[int, ...] | None = None  # template nodes drafted this step (None: all)

    def _confidences(self) -> bool:
        """Whether the matrix keeps each entry's probability (the choosers read them)."""
        return False

    # the source's state under the names the engine's tests and the batch policy read
    matrix = property(lambda self: self.source.matrix)
    written = property(lambda self: self.source.written)
    probs = property(lambda self: self.source.probs)
    tree = property(lambda self: self.source.template)
    device = property(lambda self: self.source.device)

    def start_question(self) -> None:
        if self.settings.cold_start:
            self.source.clear()

    def reset(self) -> None:
        self.source.clear()
        self.source.statistics.clear()
        self._drafted = None

    def take_statistics(self) -> dict:
        return self.source.statistics.take()

    def share_learned_state(self, other: "TokenRecycling") -> None:
        """One matrix for every request of a batch, as one TR server would keep it."""
        self.source.share(other.source)

    def propose(self, state: DecodeState) -> Draft:
        return Draft(tokens=self.source.expand(int(state.tokens[-1]))[0][1:], tree=self.tree)

    def _note(self, outcome: StepOutcome) -> None:
        """What a variant counts of a step before the matrix learns from it."""

    def observe(self, outcome: StepOutcome) -> None:
        self._note(outcome)
        self.source.observe(outcome, self._drafted)

    @classmethod
    def observe_batch(cls, drafters: list["TokenRecycling"], outcomes: list[StepOutcome]) -> None:
        """Each request's step noted, then one write per shared matrix (drafting/recycling.py)."""
        for d, o in zip(drafters, outcomes, strict=True):
            d._note(o)
        observe_batch([d.source for d in drafters], outcomes, [d._drafted for d in drafters],
                      [True] * len(drafters))

    def observe_prompt(self, prompt: torch.Tensor, logits: torch.Tensor) -> None:
        self.source.observe_prompt(prompt, logits)

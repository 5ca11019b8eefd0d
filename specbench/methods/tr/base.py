"""Token Recycling (arXiv 2408.08696): draft from an adjacency matrix of recycled top-k tokens.

After every verification forward, the top-k tokens the model predicted at each row overwrite the
matrix row of that row's token. Drafting expands a static tree template from the root: the r-th
child of a node is rank r of its token's row. The matrix survives across questions (hot start).

Ablations (each a method.<name>= setting): `update=accepted` writes only the rows on the accepted
path (the root's and the accepted nodes'); `prefill_update=true` also writes a row for every prompt
token from the prefill's logits; `cold_start`, `k` and `tree` as named. Every run counts where in
the template acceptance happens (specbench/drafting/recycling_statistics.py). The matrix, its
template and its learning are the drafting library's (specbench/drafting/recycling.py).

The three TR methods are one drafter, the matrix (the source) and a chooser of what a step verifies
of the template it expands: all of it (`tr`, `WholeTemplate` here), the sub-tree worth its forward
on the cost curve (`tr_adaptive`, adaptive.py), or that sub-tree merged with a retrieved continuation
(`tr_fused`, fused.py). A variant names its settings and its chooser; it overrides nothing.
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


class WholeTemplate:
    """`tr`'s chooser: every step verifies the whole template, as the paper does.

    A chooser is built from the settings, the target's facts and the source it drafts from, and
    answers `propose`; `drafted` names the template nodes it drafted this step (None: all of them),
    which the matrix's statistics count; `note` sees each outcome before the matrix learns from it."""

    drafted: tuple[int, ...] | None = None

    def __init__(self, settings: TRSettings, target, source: Recycling):
        self.source = source

    @staticmethod
    def check_files(settings: dict) -> None:
        """Refuse, before any model loads, a file the settings name that cannot be read."""

    @staticmethod
    def keeps_confidences(settings, target) -> bool:
        """Whether the matrix keeps each entry's probability (the goodput choosers read them)."""
        return False

    def reset(self) -> None:
        """Back to what was built (after warm-up)."""

    def propose(self, state: DecodeState) -> Draft:
        return Draft(tokens=self.source.expand(int(state.tokens[-1]))[0][1:], tree=self.source.template)

    def note(self, outcome: StepOutcome) -> None:
        """What the chooser counts of a step before the matrix learns from it."""

    def take_statistics(self) -> dict:
        return {}


@register("tr")
class TokenRecycling(Drafter, ReadsPromptLogits, LearnsAcrossRequests):
    """The matrix (`source`) and a chooser (`chooser`, of the class `Chooser`)."""

    Settings = TRSettings
    Chooser = WholeTemplate

    def __init__(self, target=None, settings: TRSettings | None = None, **values):
        super().__init__(target, settings, **values)
        self.reads_prompt_logits = bool(self.settings.prefill_update)
        confidences = self.Chooser.keeps_confidences(self.settings, self.target)
        self.source = Recycling(self.settings, self.target.vocab_size, self.target.device, confidences)
        self.chooser = self.Chooser(self.settings, self.target, self.source)

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        p = super().check_settings(params, target)
        cls.Chooser.check_files(p)
        return p

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
        self.chooser.reset()

    def take_statistics(self) -> dict:
        return {**self.source.statistics.take(), **self.chooser.take_statistics()}

    def share_learned_state(self, other: "TokenRecycling") -> None:
        """One matrix for every request of a batch, as one TR server would keep it."""
        self.source.share(other.source)

    def propose(self, state: DecodeState) -> Draft | None:
        return self.chooser.propose(state)

    def observe(self, outcome: StepOutcome) -> None:
        self.chooser.note(outcome)
        self.source.observe(outcome, self.chooser.drafted)

    @classmethod
    def observe_batch(cls, drafters: list["TokenRecycling"], outcomes: list[StepOutcome]) -> None:
        """Each request's step noted, then one write per shared matrix (drafting/recycling.py)."""
        for d, o in zip(drafters, outcomes, strict=True):
            d.chooser.note(o)
        observe_batch([d.source for d in drafters], outcomes, [d.chooser.drafted for d in drafters],
                      [True] * len(drafters))

    def observe_prompt(self, prompt: torch.Tensor, logits: torch.Tensor) -> None:
        self.source.observe_prompt(prompt, logits)

"""The one interface every method implements, and the records that cross it.

The engine calls `propose` before each verification forward and `observe` after it; the runner calls
`start_question` between questions and `reset` after warm-up. That is the whole protocol. What only
some methods need is a capability they opt into by also deriving from it, and the engines ask
`isinstance`: `ReadsHiddenStates` (Medusa, EAGLE), `ReadsPromptLogits` (TR's prefill update),
`LearnsAcrossRequests` (TR's matrix under batching), `OverridesTargets` (Medusa's lossy typical
acceptance). A drafter never touches the model or the KV cache; the engine never knows which
drafter it runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from specbench.draft import DecodeState, Draft, StepOutcome
from specbench.errors import SettingsError

@dataclass
class Target:
    """What the runner knows of the target and offers every drafter; facts, not method.<name>= settings.
    Each drafter takes what it needs (Medusa the model's vocabulary projection, adaptive TR the cost
    curve) and ignores the rest."""

    vocab_size: int = 0
    device: str | torch.device = "cpu"
    model: Any = None
    model_name: str = ""
    dtype_name: str | None = None
    hardware_curve: Any = None  # the run's cost curve t(w) (specbench/speculation/cost.py), if any
    sampler: Any = None  # the run's PositionSampler when sampling (rebound per question and turn), else None


TARGET_FACTS = tuple(f.name for f in dataclasses.fields(Target))


@dataclass
class NoSettings:
    """A method without settings (AR)."""
# What a method setting must be, by the type of its default (others are the method's to check).
SETTING_KINDS = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
}


class Drafter:
    """Base class: no draft at all, which is autoregressive decoding.

    A method declares its settings as a dataclass beside it (`Settings`; a variant's extends its
    parent's), which refuses values that cannot work when built (`__post_init__`, raising
    SettingsError), and is built from the target's facts and those settings:
    `Method(target, settings)`, or with keywords, `Method(vocab_size=..., k=4)`, which sorts them into
    the two (an unknown keyword is a TypeError, never silently dropped)."""

    name = "base"
    lossless = True  # False: tokens the target would not choose may be emitted (see OverridesTargets)
    Settings: ClassVar[type] = NoSettings

    def __init__(self, target: Target | None = None, settings=None, **values):
        facts = {k: values.pop(k) for k in list(values) if k in TARGET_FACTS}
        self.target = target if target is not None else Target(**facts)
        self.settings = settings if settings is not None else self.Settings(**values)

    # -- settings, checked before any model loads (the registry and the run's identity use these) -----

    @classmethod
    def parameters(cls) -> dict:
        """The method's settings (method.<name>=...) and their defaults, from its Settings dataclass."""
        return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cls.Settings)}

    @classmethod
    def resource_identity(cls, params: dict) -> dict:
        """What the answers depend on beyond the settings' values: the content behind a setting
        that names a file (REST's datastore: `default` today need not be `default` tomorrow).
        Joins the run's resume identity, so a changed resource never resumes old answers."""
        return {}

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        """Refuse settings that cannot work, before any model is loaded (raises SettingsError);
        returns them with the defaults filled in.

        `params`: the method.* settings; `target`: what is known of the target before loading it
        (model_name, device, dtype_name). Here: unknown names, a value whose type differs from an
        int, float or bool default, then the values as the Settings dataclass checks them when built
        (its `__post_init__`: the same check a drafter's construction makes). A method overrides this,
        calling it first, only for what its settings name to load (a datastore, heads, a draft model)."""
        accepted = cls.parameters()
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise SettingsError(
                f"method {cls.name} has no setting {', '.join(unknown)}; its settings are "
                f"{', '.join(accepted) or 'none'} (see {cls.__name__}.Settings)")
        for key, value in params.items():
            kind, ok = SETTING_KINDS.get(type(accepted[key]), ("", None))
            if ok and not ok(value):
                raise SettingsError(f"method.{key} must be {kind} (default {accepted[key]}), got {value!r}")
        filled = {**accepted, **params}
        cls.Settings(**filled)
        return filled

    # -- the protocol ------------------------------------------------------------------------------

    def propose(self, state: DecodeState) -> Draft | None:
        """Return a draft for this step, or None for a plain autoregressive step."""
        return None

    def observe(self, outcome: StepOutcome) -> None:
        """See the verification's results (logits at every row, accepted nodes)."""

    def start_question(self) -> None:
        """Called before each question; reset per-question state here."""

    def reset(self) -> None:
        """Back to the freshly built state, forgetting everything learnt (TR's matrix, Lookahead's
        pool, running statistics). The runner calls it after warm-up so that nothing learnt there
        reaches a measured question. A drafter with state beyond the question overrides it."""
        self.start_question()

    def take_statistics(self) -> dict | None:
        """What the drafter counted since the last call (counts and lists of counts, summable
        across questions with run.metrics.sum_statistics), then forget it. The runner stores it
        with each question's answers; None: the method counts nothing."""
        return None


# -- capabilities: a method derives from the ones it needs --------------------------------------------

class ReadsHiddenStates:
    """The target's last-layer hidden states: at every prompt row (observe_prefill) and at every
    verified row (StepOutcome.hidden_states)."""

    def observe_prefill(self, hidden: torch.Tensor) -> None:
        """The last layer's hidden states at every prompt row (rows, hidden; the last row chose the
        first token). Work done on them belongs in the first `propose`, which the turn's time
        includes."""


class ReadsPromptLogits:
    """The target's logits at every prompt row, computed inside the timed prefill."""

    reads_prompt_logits = True  # an instance whose settings do not use them turns this off

    def observe_prompt(self, prompt: torch.Tensor, logits: torch.Tensor) -> None:
        """The prompt's tokens (CPU) and the target's logits at every prompt row (rows, vocab; on the
        model's device)."""


class LearnsAcrossRequests:
    """State that spans requests (TR's matrix), shared by every drafter of a batched run."""

    def share_learned_state(self, other: "Drafter") -> None:
        """Learn into, and draft from, `other`'s state that spans requests, keeping what belongs to
        one request (a context, a window) apart."""

    @classmethod
    def observe_batch(cls, drafters: list["Drafter"], outcomes: list[StepOutcome]) -> None:
        """One step's outcomes, `outcomes[i]` for `drafters[i]` (each request's drafter, all of this
        class), in request order. A method whose learning is small tensor work on the shared state
        does it once for the batch, and must leave that state as if they had observed in turn."""
        for drafter, outcome in zip(drafters, outcomes, strict=True):
            drafter.observe(outcome)


class OverridesTargets:
    """Lossy acceptance (the drafter sets `lossless = False`): the target's token at each tree row
    may be replaced before the path is accepted, e.g. Medusa's typical acceptance."""

    def override_targets(self, draft: Draft, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """targets: (rows,) the target's tokens, root first; returns the ones to accept against."""
        return targets


def reads_hidden_states(drafter) -> bool:
    return isinstance(drafter, ReadsHiddenStates)


def reads_prompt_logits(drafter) -> bool:
    return isinstance(drafter, ReadsPromptLogits) and drafter.reads_prompt_logits


def observe_batch(drafters: list, outcomes: list[StepOutcome]) -> None:
    """One step's outcomes to drafters of one class: at once where the method learns across requests."""
    if isinstance(drafters[0], LearnsAcrossRequests):
        type(drafters[0]).observe_batch(drafters, outcomes)
    else:
        for drafter, outcome in zip(drafters, outcomes, strict=True):
            drafter.observe(outcome)

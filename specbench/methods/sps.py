"""Speculative sampling, SpS (Leviathan et al. 2023; Chen et al. 2023; Spec-Bench's inference_sps.py):
a small draft model that shares the target's tokenizer proposes a chain of `gamma` tokens, one at a
time; one target forward verifies them.

The draft is a separate model (`draft=vicuna-68m`, a conf/model name, a local directory or a hub id)
or the target cut short (`draft=self:layers=N`, every weight shared). It keeps its own KV cache,
always a prefix of the decided sequence, and its prefill runs inside the first proposal of a turn,
so it is timed. At T > 0 the draft proposes with the run's position-keyed Gumbel noise
(`self.sampler`), a coupling that stands in for SpS's min(1, p/q) rule and keeps the output equal to
AR's; without a sampler, or with `coupled=false`, it proposes its argmax. Details: docs/sps.md.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from specbench.decoding.kv_cache import with_cache
from specbench.draft import DraftTree, DecodeState, Draft, StepOutcome
from specbench.drafter import Drafter
from specbench.errors import SettingsError
from specbench.inputs.models import MODEL_CONFIGS, check_model_config, load_model, model_config, named_model_config
from specbench.registry import register

SELF_DRAFT = re.compile(r"self:layers[=:](\d+)")  # ':' needs no escaping on Hydra's command line


@dataclass
class SpSSettings:
    # self:layers=N (the target's first N layers + its norm and head), or a separate draft model with
    # the target's tokenizer: a conf/model name (vicuna-68m), a local directory or a hub id (owner/name).
    # On the command line write self:layers:N (Hydra reads '=' in a value as an error unless escaped).
    # Default 4: SmolLM2-135M's early exits are accepted about equally rarely up to 16 of its 30 layers
    # (docs/sps.md), so the cheapest one loses least.
    draft: str = "self:layers=4"
    gamma: int = 5  # draft tokens per step (transformers' assisted generation starts at 5, as Spec-Bench ran it)
    coupled: bool = True  # T > 0: draft with the target's position-keyed noise; false: the draft's argmax

    def __post_init__(self):
        if self.gamma < 1:
            raise SettingsError(f"method.gamma must be at least 1 (draft tokens per step), got {self.gamma}")
        parse_draft(self.draft)  # a malformed self: spec


def parse_draft(draft) -> int | None:
    """The layer count of a self-speculative draft, or None for a separate model; a malformed
    `self:` spec is refused."""
    if not isinstance(draft, str) or not draft:
        raise SettingsError(f"method.draft must be self:layers=N or a draft model (a conf/model name, a "
                            f"directory or a hub id), got {draft!r}")
    if draft != "self" and not draft.startswith("self:"):
        return None
    match = SELF_DRAFT.fullmatch(draft)
    if match is None or int(match.group(1)) < 1:
        raise SettingsError(f"method.draft={draft} is not a self-speculative draft; write self:layers=N "
                            f"with N >= 1 (the target's first N decoder layers)")
    return int(match.group(1))


def draft_model_config(draft: str) -> dict:
    """The model config of a separate draft: conf/model/<draft>.yaml, else `draft` as a local
    directory or a hub id. A bare word that names neither is refused (most likely a misspelt name)."""
    if (MODEL_CONFIGS / f"{draft}.yaml").is_file():
        return named_model_config(draft)
    if not Path(draft).exists() and "/" not in draft:
        valid = ", ".join(sorted(f.stem for f in MODEL_CONFIGS.glob("*.yaml")))
        raise SettingsError(f"method.draft={draft} is neither self:layers=N, a model config ({valid}), a "
                            f"local directory nor a hub id (owner/name)")
    return {"name": Path(draft).name, "path": draft}


def self_draft(model: nn.Module, layers: int) -> nn.Module:
    """The target's first `layers` decoder layers, final norm and head as a model of its own class.

    A deep copy that takes every parameter and buffer from the memo (with_packed_linears' twin does
    the same) shares the target's tensors instead of copying them; only the module objects and the
    config are new, so cutting the twin's layer list and config leaves the target untouched."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    twin = copy.deepcopy(model, shared)
    decoder = twin.get_decoder()
    total = len(getattr(decoder, "layers", ()))
    if total == 0:
        raise SettingsError(f"method.draft=self:layers={layers}: cannot find the decoder layers of "
                            f"{type(model).__name__}; give a separate draft model instead")
    if layers > total:
        raise SettingsError(f"method.draft=self:layers={layers}, but the target has {total} decoder layers; "
                            f"use 1 to {total}")
    decoder.layers = nn.ModuleList(list(decoder.layers)[:layers])
    # The forward reads its layer count (and per-layer attention types) from the config.
    for cfg in {id(c): c for c in (twin.config, decoder.config)}.values():
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        cfg.num_hidden_layers = layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = list(cfg.layer_types[:layers])
    return twin.eval()


@register("sps")
class SpeculativeSampling(Drafter):
    Settings = SpSSettings

    def __init__(self, target=None, settings: SpSSettings | None = None, **values):
        super().__init__(target, settings, **values)
        s, model = self.settings, self.target.model
        layers = parse_draft(s.draft)
        if model is None:
            raise SettingsError("SpS needs the target model (its layers, or its device and dtype for the draft)")
        if layers is not None:
            self.draft_model = self_draft(model, layers)
        else:
            self.draft_model = load_model(draft_model_config(s.draft), model.device, model.dtype)[0]
            vocab = self.draft_model.get_output_embeddings().weight.shape[0]
            target_vocab = model.get_output_embeddings().weight.shape[0]
            if vocab != target_vocab:
                raise SettingsError(f"method.draft={s.draft} has a vocabulary of {vocab} tokens, the target "
                                    f"{target_vocab}: SpS needs a draft with the target's tokenizer")
        self.sampler = getattr(self.target, "sampler", None)
        self.start_question()

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        p = super().check_settings(params, target)
        if parse_draft(p["draft"]) is None:  # a separate model: its config and local path
            check_model_config(model_config(draft_model_config(p["draft"])))
        return p

    def start_question(self) -> None:
        self._cache: DynamicCache | None = None
        self._root_end = 0  # len(state.tokens) at the last proposal: where the draft tokens begin

    @torch.inference_mode()
    def _next_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed `ids` (1-D) after what the cache holds; the draft's logits after the last of them."""
        out = self.draft_model(input_ids=ids[None].to(self.draft_model.device), use_cache=True, logits_to_keep=1,
                               **with_cache(self.draft_model, self._cache))
        return out.logits[0, -1:]

    def _choose(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """The draft's token after the row at absolute `position`, shape (1,), on the model's device."""
        if self.settings.coupled and self.sampler is not None:
            return self.sampler(logits, torch.tensor([position]))  # host positions, as the engine's
        return logits.argmax(dim=-1)

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Draft:
        tokens = state.tokens
        if state.step == 0 or self._cache is None:  # a new turn: the draft prefills its prompt here, timed
            self._cache = DynamicCache()
        logits = self._next_logits(tokens[self._cache.get_seq_length():])
        root = tokens.numel() - 1  # the root's position: the target chooses the first draft token's slot there
        chain = []
        for i in range(self.settings.gamma):
            chain.append(self._choose(logits, root + i))
            if i + 1 < self.settings.gamma:  # the last draft token is fed only if it is accepted (next proposal)
                logits = self._next_logits(chain[-1])
        self._root_end = tokens.numel()
        return Draft(tokens=torch.cat(chain), tree=DraftTree.chain(self.settings.gamma))

    def observe(self, outcome: StepOutcome) -> None:
        # The cache holds the sequence up to the root, then draft tokens 1 .. gamma-1: keep the accepted
        # ones (a whole chain accepted: all of them; the last draft token is fed next time, with the bonus).
        surplus = self._cache.get_seq_length() - (self._root_end + len(outcome.accepted))
        if surplus > 0:
            self._cache.crop(-surplus)  # a negative count removes tokens, in every transformers 5.x

"""REST (Retrieval-Based Speculative Decoding, He et al. 2023; FasterDecoding/REST).

Each step looks up the longest suffix of the context (16 tokens down to 2) with any hit in a
datastore (corpus token ids + suffix array), takes the 10 tokens after each of up to 5000 hits,
and verifies the most frequent continuation prefixes as one token tree: by default (trie=reference)
the 64 most frequent, trimmed as the reference DraftRetriever trims them (longest paths dropped
while the kept paths' lengths add up to more than 64: about 25 nodes a step); trie=all_prefixes
verifies all 64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.draft import DecodeState, Draft
from specbench.drafter import Drafter
from specbench.errors import SettingsError
from specbench.registry import register
from specbench.inputs.models import loaded_tokenizer
from specbench.drafting.datastore import (TRIE_RULES, Datastore, DatastoreError, check_tokenizer, open_datastore, resolve_path, vocab_sha256)
from specbench.draft import DraftTree


@dataclass
class RestSettings:
    """Spec-Bench's settings. `datastore`: default = data/rest/smollm2-135m-selfdistil, built for the
    embedded SmolLM2 from the model's own answers to non-benchmark prompts (data/rest/README.md); any
    other name under data/rest/ or a directory; other models: scripts/build_rest_datastore.py."""

    datastore: str = "default"
    num_draft: int = 64  # draft budget: the most frequent continuation prefixes taken per step
    # which of those prefixes are verified: reference = as REST's DraftRetriever (paths dropped longest
    # first while their lengths add up to more than num_draft); all_prefixes = all of them
    trie: str = "reference"
    max_token_span: int = 16  # longest context suffix queried; then shorter, down to min_token_span
    min_token_span: int = 2
    max_matches: int = 5000  # hits (in suffix-array order) whose continuations are counted
    continuation_len: int = 10  # tokens taken after each hit

    def __post_init__(self):
        for name in ("num_draft", "min_token_span", "max_matches", "continuation_len"):
            if int(getattr(self, name)) < 1:
                raise SettingsError(f"REST: method.{name} must be at least 1, got {getattr(self, name)}")
        if self.trie not in TRIE_RULES:
            raise SettingsError(f"REST: method.trie must be one of {', '.join(TRIE_RULES)}, got '{self.trie}'")
        if self.max_token_span < self.min_token_span:
            raise SettingsError(f"REST: method.max_token_span ({self.max_token_span}) is below "
                                f"method.min_token_span ({self.min_token_span})")


@register("rest")
class Rest(Drafter):
    Settings = RestSettings

    def __init__(self, target=None, settings: RestSettings | None = None, **values):
        super().__init__(target, settings, **values)
        vocab_size = self.target.vocab_size
        self.store = Datastore(resolve_path(self.settings.datastore))
        # the ids must be this tokenizer's: a store for SmolLM2 fits Gemma-3's larger vocabulary too
        tokenizer = loaded_tokenizer(self.target.model)
        check_tokenizer(self.store.path, self.store.meta, self.target.model_name,
                        vocab_sha256(tokenizer) if tokenizer is not None else "")
        top = int(self.store.meta.get("max_token_id", -1))
        if top >= vocab_size or self.store.vocab_size > vocab_size:
            raise DatastoreError(
                f"REST datastore '{self.store.path}' was built with tokenizer "
                f"'{self.store.meta.get('tokenizer')}' (vocabulary {self.store.vocab_size}), which does not "
                f"fit this model's vocabulary of {vocab_size}. The default store is for the embedded "
                f"smollm2-135m; build one for this model with scripts/build_rest_datastore.py and pass "
                f"method.datastore=<dir>"
            )

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        """The datastore's files and metadata (its arrays are not read): a store that records another
        model and no vocabulary hash is refused before the model loads."""
        p = super().check_settings(params, target)
        path = resolve_path(p["datastore"])
        meta, _, _ = open_datastore(path)
        check_tokenizer(path, meta, target.get("model_name", ""), before_loading=True)
        return p

    @classmethod
    def resource_identity(cls, params: dict) -> dict:
        path = resolve_path(params.get("datastore", "default"))
        meta, _, _ = open_datastore(path)
        return {"datastore": path.name, "datastore_tokens": meta.get("n_tokens")}

    def propose(self, state: DecodeState) -> Draft | None:
        s = self.settings
        hit = self.store.search(state.tokens[-s.max_token_span :].tolist(), max_span=s.max_token_span,
                                min_span=s.min_token_span, max_matches=s.max_matches,
                                continuation_len=s.continuation_len, num_draft=s.num_draft, trie=s.trie)
        if hit is None:
            return None
        prefixes, parents, _ = hit
        tokens = torch.tensor([p[-1] for p in prefixes], dtype=torch.long)
        return Draft(tokens=tokens, tree=DraftTree(parents))

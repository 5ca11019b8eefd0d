"""SAM-Decoding (Hu et al., ACL 2025, arXiv 2411.10666), its train-free configuration: retrieval
from suffix automata, Token Recycling's tree when retrieval has nothing good to offer.

Each step looks the root up in a dynamic suffix automaton over this turn's prompt and output
(drafting/suffix_automaton.py) and optionally a static one over a corpus (`static_corpus`). When the longer
match (the static one counted `len_bias` shorter) reaches `len_threshold` tokens, the step drafts the
chain that followed the match's first occurrence (up to `max_draft`), else TR's tree from the
adjacency matrix (drafting/recycling.py), which learns from every verified row and from the
prompt's logits. Defaults are
Spec-Bench's published settings. Those settings, and where this departs from the reference on
purpose: docs/samd.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from specbench.draft import DraftTree, DecodeState, Draft, StepOutcome
from specbench.drafter import Drafter, LearnsAcrossRequests, ReadsPromptLogits
from specbench.drafting.recycling import Recycling, RecyclingSettings, observe_batch
from specbench.errors import SettingsError
from specbench.drafting.datastore import (SEPARATOR as STORE_SEPARATOR, DatastoreError, open_datastore, resolve_path)
from specbench.drafting.suffix_automaton import SEPARATOR, Match, SuffixAutomaton, feed, follow
from specbench.registry import register

# SAM-Decoding's Token Recycling tree (its config/token_recycle.json), as child counts per node,
# depth by depth, breadth-first (the form of TR's `tree` setting): 60 draft nodes, depth 5, nodes per
# depth 7, 20, 21, 8, 4. TR's own published tree has 80 nodes (method.tree=published).
SAMD_TREE = [
    [7],
    [6, 5, 3, 2, 2, 1, 1],
    [3, 2, 2, 1, 1, 0, 3, 2, 1, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0],
    [2, 1, 0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0],
    [2, 0, 1, 0, 1, 0, 0, 0],
]

DYNAMIC, STATIC, TREE = "dynamic", "static", "tree"  # where a step's draft came from
SOURCES = (DYNAMIC, STATIC, TREE)


@dataclass
class SAMDSettings(RecyclingSettings):
    # TR's settings as SAM-Decoding runs it: its own tree, and rows written from the prefill's logits
    tree: Any = field(default_factory=lambda: [list(level) for level in SAMD_TREE])
    prefill_update: bool = True
    max_draft: int = 39  # chain tokens after the root (the reference's n_predicts = 40 rows)
    len_threshold: int = 5  # shortest match that is drafted from; shorter: TR's tree
    len_bias: int = 5  # a static match counts this many tokens less against the dynamic one
    # None: no static automaton (Spec-Bench's run); a REST datastore (default, a name under data/rest/,
    # or a directory) whose corpus the static automaton indexes
    static_corpus: Optional[str] = None

    def __post_init__(self):
        super().__post_init__()
        if self.max_draft < 1:
            raise SettingsError(f"method.max_draft must be at least 1 (chain tokens per step), got {self.max_draft}")
        if self.len_threshold < 1:
            raise SettingsError(f"method.len_threshold must be at least 1 (the shortest match drafted from; "
                                f"the reference uses 5), got {self.len_threshold}")
        if self.len_bias < 0:
            raise SettingsError(f"method.len_bias must be 0 or more (tokens a static match counts less), "
                                f"got {self.len_bias}")


@lru_cache(maxsize=2)
def static_automaton(path: Path) -> SuffixAutomaton:
    """The automaton of a datastore's corpus, documents kept apart. Read-only once built, so every
    drafter on the same corpus shares one (about half a second and 40 MB for 85k tokens)."""
    _, tokens, _ = open_datastore(path)
    ids = np.asarray(tokens).astype(np.int64)
    ids[ids == STORE_SEPARATOR] = SEPARATOR
    return SuffixAutomaton(ids.tolist())


@register("samd")
class SAMDecoding(Drafter, ReadsPromptLogits, LearnsAcrossRequests):
    Settings = SAMDSettings

    def __init__(self, target=None, settings: SAMDSettings | None = None, **values):
        super().__init__(target, settings, **values)
        s = self.settings
        self.reads_prompt_logits = bool(s.prefill_update)
        self.source = Recycling(s, self.target.vocab_size, self.target.device)
        self.static = None
        if s.static_corpus is not None:
            path = resolve_path(s.static_corpus)
            meta, _, _ = open_datastore(path)
            if int(meta.get("max_token_id", -1)) >= self.target.vocab_size:
                raise DatastoreError(f"the static corpus '{path}' was built with tokenizer '{meta.get('tokenizer')}', "
                                     f"whose ids do not fit this model's vocabulary of {self.target.vocab_size}; "
                                     f"build one for this model with scripts/build_rest_datastore.py")
            self.static = static_automaton(path)
        self._new_turn()
        self._clear_counts()

    matrix = property(lambda self: self.source.matrix)  # the fallback's matrix, as TR's drafters name it

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        p = super().check_settings(params, target)
        if p["static_corpus"] is not None:
            open_datastore(resolve_path(p["static_corpus"]))
        return p

    @classmethod
    def resource_identity(cls, params: dict) -> dict:
        corpus = params.get("static_corpus")
        if corpus is None:
            return {}
        path = resolve_path(corpus)
        meta, _, _ = open_datastore(path)
        return {"static_corpus": path.name, "static_corpus_tokens": meta.get("n_tokens")}

    def _new_turn(self) -> None:
        """A fresh dynamic automaton (the reference builds one per generation call, i.e. per turn)."""
        self.dynamic = SuffixAutomaton()
        self.dynamic_match = Match()  # longest suffix of the automaton's text that occurred earlier in it
        self.static_match = Match()  # longest suffix of the same text found in the corpus
        self._fed = 0  # decided tokens in the automaton: all but the root
        self._source = TREE

    def _clear_counts(self) -> None:
        self._counts = {f"{what}_{src}": 0 for what in ("steps", "drafted", "accepted") for src in SOURCES}

    def start_question(self) -> None:
        if self.settings.cold_start:
            self.source.clear()

    def reset(self) -> None:
        self.source.clear()
        self.source.statistics.clear()
        self._new_turn()
        self._clear_counts()

    def share_learned_state(self, other: "SAMDecoding") -> None:
        """One matrix for every request of a batch; the automata stay each request's own."""
        self.source.share(other.source)

    def take_statistics(self) -> dict:
        """TR's per-node counts over the steps that drafted its tree, and per source (dynamic automaton,
        static automaton, tree): steps, drafted tokens and accepted tokens."""
        out = self.source.statistics.take()
        out.update(self._counts)
        self._clear_counts()
        return out

    def retrieve(self, root: int) -> tuple[str, list[int]]:
        """(source, chain) for a root: a retrieved chain, or (TREE, []) when no match is long enough."""
        dyn = self.dynamic.step(self.dynamic_match, root)
        static = self.static.step(self.static_match, root) if self.static is not None else Match()
        if max(dyn.length, static.length - self.settings.len_bias) < self.settings.len_threshold:
            return TREE, []
        if dyn.length >= static.length - self.settings.len_bias:
            # A recent match may be followed by few tokens yet; a shorter one that first occurred
            # earlier may offer a whole chain (the reference's walk to an ancestor).
            state = self.dynamic.with_room(dyn.state, self.settings.max_draft)
            return DYNAMIC, self.dynamic.continuation(state, self.settings.max_draft)
        return STATIC, self.static.continuation(static.state, self.settings.max_draft)

    def propose(self, state: DecodeState) -> Draft:
        seq = state.tokens
        if state.step == 0:
            self._new_turn()
        new = seq[self._fed : -1].tolist()
        self._fed = seq.numel() - 1
        self.dynamic_match = feed(self.dynamic, self.dynamic_match, new)
        if self.static is not None:
            self.static_match = follow(self.static, self.static_match, new)
        root = int(seq[-1])
        source, chain = self.retrieve(root)
        self._source = source if chain else TREE
        if not chain:
            return Draft(tokens=self.source.expand(root)[0][1:], tree=self.source.template)
        return Draft(tokens=torch.tensor(chain, dtype=torch.long), tree=DraftTree.chain(len(chain)))

    def _note(self, outcome: StepOutcome) -> None:
        """Per source: steps, drafted and accepted tokens."""
        src = self._source
        self._counts[f"steps_{src}"] += 1
        self._counts[f"drafted_{src}"] += 0 if outcome.draft is None else len(outcome.draft.tree)
        # accepted draft tokens that were emitted (EOS or the token budget may cut a path short)
        self._counts[f"accepted_{src}"] += min(len(outcome.accepted), len(outcome.emitted))

    def observe(self, outcome: StepOutcome) -> None:
        """The matrix learns from every step; TR's per-node statistics describe its template, so they
        count the TREE steps only."""
        self._note(outcome)
        self.source.observe(outcome, None, counted=self._source == TREE)

    @classmethod
    def observe_batch(cls, drafters: list["SAMDecoding"], outcomes: list[StepOutcome]) -> None:
        for d, o in zip(drafters, outcomes, strict=True):
            d._note(o)
        observe_batch([d.source for d in drafters], outcomes, [None] * len(drafters),
                      [d._source == TREE for d in drafters])

    def observe_prompt(self, prompt: torch.Tensor, logits: torch.Tensor) -> None:
        self.source.observe_prompt(prompt, logits)

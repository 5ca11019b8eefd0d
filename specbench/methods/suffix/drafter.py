"""Suffix Decoding (Oliaro et al., arXiv 2411.04975) as vLLM ships it (`method: suffix`).

Model-free drafting from two suffix trees: one over the current turn's prompt and output, one
(global) over the answers of turns, the running one included, kept across questions up to
`max_cached_requests` answers. Each step drafts the best-scoring continuation of the context's tail
from either tree (suffix/tree.py), one path by default (vLLM's) or a tree with `use_tree=true`.
`backend=` picks Snowflake's arctic-inference (the package vLLM calls, `pip install -e ".[suffix]"`)
or ours in pure Python (the same drafts, ties aside). `running_in_global=false` keeps the earlier
protocol (an answer joins the global tree once answered); `reset()` forgets both trees.
Defaults, protocol and backends: docs/suffix-decoding.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch

from specbench.draft import DraftTree, DecodeState, Draft, StepOutcome
from specbench.drafter import Drafter
from specbench.errors import SettingsError
from specbench.drafting.suffix_backends import backend_line, resolve_backend, suffix_trees, tells_source
from specbench.registry import register


@dataclass
class SuffixSettings:
    max_tree_depth: int = 24  # longest string in the trees: the match and the draft share this depth
    max_spec_factor: float = 1.0  # a draft holds at most max_spec_factor x match length + max_spec_offset tokens
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1  # tokens whose estimated probability (from frequencies) is below this are dropped
    max_cached_requests: int = 10000  # answered turns kept in the global tree, oldest evicted first; 0: no global tree
    use_tree: bool = False  # true: a tree of the likeliest continuations; false: one path (vLLM)
    backend: str = "auto"  # arctic: arctic-inference's trees; python: ours; auto: arctic where it is installed
    # true (arctic-inference, vLLM): the running turn's output joins the global tree as it is
    # generated; false: only once the turn is answered (this harness before issue 47, for comparison)
    running_in_global: bool = True
    # true: count which tree (the request's or the global) each draft came from. On arctic-inference that takes
    # a second cache, timed with the method (tells_source); vLLM keeps one, and so does this drafter by default
    source_stats: bool = False

    def __post_init__(self):
        if self.max_tree_depth < 2:
            raise SettingsError(f"method.max_tree_depth must be at least 2 (a match and a drafted token), "
                                f"got {self.max_tree_depth}")
        if self.max_spec_factor < 0:
            raise SettingsError(f"method.max_spec_factor must be at least 0, got {self.max_spec_factor}")
        if self.max_spec_factor * (self.max_tree_depth - 1) + self.max_spec_offset < 1:
            raise SettingsError(f"with method.max_spec_factor={self.max_spec_factor} and "
                                f"method.max_spec_offset={self.max_spec_offset} no match of up to "
                                f"{self.max_tree_depth - 1} tokens earns a drafted token; raise one of them "
                                f"(vLLM: 1.0 and 0)")
        if not 0 <= self.min_token_prob <= 1:
            raise SettingsError(f"method.min_token_prob must lie in [0, 1], got {self.min_token_prob}")
        if self.max_cached_requests < 0:
            raise SettingsError(f"method.max_cached_requests must be at least 0 (0: no global tree), "
                                f"got {self.max_cached_requests}")
        resolve_backend(self.backend)


STAT_KEYS = ("plain_steps", "drafted_steps", "drafted_tokens")
SOURCE_KEYS = ("drafts_from_request", "drafts_from_global", "accepted_from_request", "accepted_from_global")


@register("suffix")
class SuffixDecoding(Drafter):
    Settings = SuffixSettings

    def __init__(self, target=None, settings: SuffixSettings | None = None, **values):
        super().__init__(target, settings, **values)
        self.backend = resolve_backend(self.settings.backend)
        line = backend_line("suffix", self.settings.backend, self.backend)
        if line:
            print(line, file=sys.stderr)
        s = self.settings
        self._stat_keys = STAT_KEYS + (SOURCE_KEYS if tells_source(self.backend, s.max_cached_requests,
                                                                   s.running_in_global, s.source_stats) else ())
        self.reset()

    @classmethod
    def resource_identity(cls, params: dict) -> dict:
        """Which trees drafted: the answers are the same, the accepted lengths may differ (ties)."""
        return {"suffix_backend": resolve_backend(params.get("backend", "auto"))}

    def reset(self) -> None:
        self._trees = None  # built when the first turn starts: a reset drafter equals a fresh one
        self._response: list[int] | None = None  # the open turn's output so far (None: no turn open)
        self._source: str | None = None  # the tree this step's draft came from
        self._trees_cache: dict[tuple[int, ...], DraftTree] = {}
        self._stats = dict.fromkeys(self._stat_keys, 0)

    def _new_trees(self):
        s = self.settings
        # a draft is bounded by the tree depth only, as vLLM's num_speculative_tokens defaults to it
        return suffix_trees(self.backend, s.max_tree_depth, s.max_cached_requests, s.max_tree_depth,
                            s.max_spec_factor, s.max_spec_offset, s.min_token_prob, s.use_tree, s.running_in_global,
                            s.source_stats)

    def start_question(self) -> None:
        self._end_turn()

    def _end_turn(self) -> None:
        """The open turn is answered: its output stays in the global tree (running_in_global) or enters it now."""
        if self._response is not None:
            self._trees.end_turn(self._response)
            self._response = None

    def _start_turn(self, state: DecodeState) -> None:
        self._end_turn()
        if self._trees is None:
            self._trees = self._new_trees()
        tokens = state.tokens.tolist()
        self._trees.start_turn(tokens[: state.prompt_len])
        first = tokens[state.prompt_len:]  # the prefill's token
        self._trees.extend(first)
        self._response = list(first)

    def propose(self, state: DecodeState) -> Draft | None:
        if state.step == 0 or self._response is None:
            self._start_turn(state)
        # numpy's slice and array, not torch's: after a CPU forward each torch call costs several of numpy's
        spec, source = self._trees.speculate(state.tokens.numpy()[-self.settings.max_tree_depth:])
        if not spec.tokens:
            self._source = None
            self._stats["plain_steps"] += 1
            return None
        self._source = source  # None: the tree is not told apart (source_stats)
        self._stats["drafted_steps"] += 1
        if source is not None:
            self._stats[f"drafts_from_{source}"] += 1
        self._stats["drafted_tokens"] += len(spec.tokens)
        return Draft(tokens=torch.from_numpy(np.array(spec.tokens, dtype=np.int64)), tree=self._tree(spec.parents))

    def _tree(self, parents: list[int]) -> DraftTree:
        """The draft's shape (node 0 is the root, so every index shifts by one), one object per shape."""
        if not self.settings.use_tree:
            return DraftTree.chain(len(parents))
        key = tuple(p + 1 for p in parents)
        tree = self._trees_cache.get(key)
        if tree is None:
            if len(self._trees_cache) > 1024:
                self._trees_cache.clear()
            tree = self._trees_cache[key] = DraftTree(key)
        return tree

    def observe(self, outcome: StepOutcome) -> None:
        self._trees.extend(outcome.emitted)
        self._response.extend(outcome.emitted)
        if self._source is not None:
            self._stats[f"accepted_from_{self._source}"] += len(outcome.accepted)

    def take_statistics(self) -> dict:
        out = dict(self._stats, suffix_backend=self.backend)
        self._stats = dict.fromkeys(self._stat_keys, 0)
        return out

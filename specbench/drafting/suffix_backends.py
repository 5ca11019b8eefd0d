"""Which suffix trees draft: Snowflake's arctic-inference (the package vLLM's `method: suffix` calls,
`pip install -e ".[suffix]"`) where it imports, else ours (suffix_tree.py). Both give the same drafts but
where two continuations are equally frequent; arctic's C++ trees cost a fraction of a step's host time
that ours do (docs/suffix-decoding.md). Suffix Decoding and `tr_fused retrieval=suffix` draft through
`suffix_trees`, so each names its backend the same way (`auto`, `arctic`, `python`).
"""

from __future__ import annotations

from importlib import metadata

import numpy as np

from specbench.drafting.suffix_tree import Speculation, SuffixTrees
from specbench.errors import SettingsError

BACKENDS = ("auto", "arctic", "python")
INSTALL = 'pip install -e ".[suffix]"'


def arctic_problem() -> str | None:
    """Why arctic-inference's suffix trees cannot be imported here, or None when they can."""
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


def arctic_version() -> str:
    """arctic-inference's installed version ('unknown' for a build without package metadata)."""
    try:
        return metadata.version("arctic-inference")
    except metadata.PackageNotFoundError:
        return "unknown"


def resolve_backend(backend: str, setting: str = "method.backend") -> str:
    """`arctic` or `python`: the trees a run drafts from. `setting`: the name the refusals give."""
    if backend not in BACKENDS:
        raise SettingsError(f"{setting} must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "python":
        return "python"
    problem = arctic_problem()
    if problem is None:
        return "arctic"
    if backend == "arctic":
        raise SettingsError(f"{setting}=arctic needs arctic-inference, which does not import here "
                            f"({problem}); install it with {INSTALL}, or use {setting}=python (ours)")
    return "python"


def backend_line(who: str, asked: str, resolved: str) -> str | None:
    """The one line a drafter prints about its trees: which arctic-inference drafts, or the warning that
    `auto` fell back to ours; None when ours were asked for."""
    if resolved == "arctic":
        return f"{who}: drafting from arctic-inference {arctic_version()}'s suffix trees"
    if asked == "auto":
        return (f"warning: {who}: arctic-inference does not import here ({arctic_problem()}); drafting from "
                f"specbench's own suffix trees, same settings ({INSTALL} for arctic's)")
    return None


def suffix_trees(backend: str, max_depth: int, max_cached: int, max_tokens: int, factor: float, offset: float,
                 min_prob: float, use_tree: bool, running_in_global: bool = True, by_source: bool = True):
    """The request's and the global tree on `backend` (resolved: `arctic` or `python`). `by_source`: say
    which tree each draft came from, where that costs arctic a second cache (`tells_source`)."""
    if backend == "arctic":
        return ArcticTrees(max_depth, max_cached, max_tokens, factor, offset, min_prob, use_tree, running_in_global,
                           by_source)
    return SuffixTrees(max_depth, max_cached, max_tokens, factor, offset, min_prob, use_tree, running_in_global)


def tells_source(backend: str, max_cached: int, running_in_global: bool, by_source: bool) -> bool:
    """Whether `suffix_trees` says which tree drafted. Ours always does, and so does arctic wherever it keeps
    the request's own tree apart anyway (no global tree, or answers joining it only once answered). Where the
    running turn is in the global cache (vLLM's use), that cache alone drafts, and only `by_source` adds the
    own-tree cache that tells its drafts apart: half as much tree work again, a step's host time that is
    not Suffix Decoding's."""
    return backend != "arctic" or by_source or not (max_cached and running_in_global)


class ArcticTrees:
    """SuffixTrees' calls on arctic-inference's SuffixDecodingCache, through its public API.

    `past` is the cache vLLM keeps (`running_in_global`, vLLM's use): each turn a request whose prompt is
    the turn's prompt and whose output is added as generated (to its own tree and to the global tree).
    To say which tree won, `own` holds the same prompt and output with the global tree off: the global
    tree won when `past` scores above `own` (the request's own tree wins ties in the cache). With
    `running_in_global=False` (the earlier protocol) `past` holds only answered turns: each turn starts
    there as a request with an empty prompt (reserving its slot, as in vLLM) and receives its answer
    when it ends. Where `past` alone drafts as `own` would (running turns in it) and the source is not asked
    for (`by_source`), `own` is not kept: its tree work would be timed as the method's (`tells_source`)."""

    def __init__(self, max_depth: int, max_cached: int, max_tokens: int, factor: float, offset: float,
                 min_prob: float, use_tree: bool, running_in_global: bool = True, by_source: bool = True):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.max_depth = max_depth
        self.running = bool(running_in_global)
        self.own = (SuffixDecodingCache(max_tree_depth=max_depth, max_cached_requests=0)
                    if tells_source("arctic", max_cached, running_in_global, by_source) else None)
        self.past = (SuffixDecodingCache(max_tree_depth=max_depth, max_cached_requests=max_cached)
                     if max_cached else None)
        self.args = dict(max_spec_tokens=max_tokens, max_spec_factor=factor, max_spec_offset=offset,
                         min_token_prob=min_prob, use_tree_spec=use_tree)
        self.turn = 0
        self._turn_tokens: list[int] = []  # the running turn's prompt and output, as SuffixTrees keeps them

    def start_turn(self, prompt) -> None:
        self.turn += 1
        self._turn_tokens = list(np.asarray(prompt).reshape(-1).tolist())
        if self.own is not None:
            self.own.start_request(self.turn, _int32(prompt))
        if self.past is not None:
            self.past.start_request(self.turn, _int32(prompt if self.running else []))

    def extend(self, tokens) -> None:
        tokens = _int32(tokens).reshape(-1)
        self._turn_tokens += tokens.tolist()
        if self.own is not None:
            self.own.add_active_response(self.turn, tokens)
        if self.past is not None and self.running:
            self.past.add_active_response(self.turn, tokens)

    def end_turn(self, response) -> None:
        if self.own is not None:
            self.own.stop_request(self.turn)
        if self.past is not None:
            if not self.running:
                self.past.add_active_response(self.turn, _int32(response))
            self.past.stop_request(self.turn)
        self._turn_tokens = []

    @property
    def turn_tokens(self) -> np.ndarray:
        """The running turn's prompt and output so far."""
        return np.asarray(self._turn_tokens, dtype=np.int64)

    def speculate(self, context) -> tuple[Speculation, str | None]:
        """The draft and its tree ("request" or "global"; None where `own` is not kept)."""
        context = _int32(context[-self.max_depth:])
        if self.own is None:
            best, source = self.past.speculate(self.turn, context, **self.args), None
            return Speculation(list(best.token_ids), list(best.parents), list(best.probs), best.match_len), source
        own = self.own.speculate(self.turn, context, **self.args)
        best, source = own, "request"
        if self.past is not None:
            past = self.past.speculate(self.turn, context, **self.args)
            if past.score > own.score:  # the request's own wins ties, as in SuffixDecodingCache
                best, source = past, "global"
        return Speculation(list(best.token_ids), list(best.parents), list(best.probs), best.match_len), source


def _int32(tokens) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(tokens, dtype=np.int32))

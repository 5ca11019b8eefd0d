"""Token Recycling fused with retrieval: one draft tree from the adjacency matrix and from the context.

Each step merges two sources by common prefixes: TR's template expanded from the matrix
(drafting/recycling.py; node probabilities as adaptive TR estimates them) and a retrieved continuation
(`retrieval=`: `pld`, the default, Prompt Lookup's chain; `suffix`, Suffix Decoding's trees; `none`).
The step verifies the parent-closed node set with the most expected tokens per second on the cost
curve, at most `max_nodes` nodes, or a plain step (speculation/goodput.py). Lossless by the engine's
verifier; the matrix learns from every verified row. Retrieval reads only decided tokens
(DecodeState), so batched decoding works the same. `matrix=false` / `retrieval=none` switch a source
off; `accepted_from_*` counts accepted tokens by source. `FusedChoice` is the chooser (base.py: the
drafter is the matrix and a chooser); it holds adaptive TR's for the template's estimates. Estimates,
options and measurements: docs/token-recycling.md, "Token Recycling fused with retrieval".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from collections import deque

import numpy as np
import torch

from specbench.decoding.transfers import to_device
from specbench.draft import DraftTree
from specbench.draft import DecodeState, Draft, StepOutcome
from specbench.errors import SettingsError
from specbench.speculation.goodput import RateTable, subtree_parents
from specbench.drafting.ngram import check_ngram, find_match
from specbench.drafting.suffix_backends import backend_line, resolve_backend, suffix_trees
from specbench.drafting.recycling import Recycling
from specbench.methods.tr.adaptive import AdaptiveTRSettings, GoodputSubtree
from specbench.methods.tr.base import TokenRecycling
from specbench.registry import register

MATRIX, RETRIEVAL = 1, 2  # source bits of a merged node
NGRAM_CLASSES = 3  # matched n-gram size 1, 2, 3 or more
SUFFIX_BINS = 10  # suffix_rates: a node's frequency estimate given its parent, in tenths
SUFFIX_DEPTHS = 3  # suffix_rates: depth 1, 2, 3 or more below the root
RETRIEVALS = ("suffix", "pld", "none")
SUFFIX_CACHED = 10000  # suffix_global: answers kept in the global tree, oldest evicted (vLLM's default)


def retrieval_source(value) -> str:
    """`method.retrieval` as one of RETRIEVALS; the earlier true / false read as pld / none."""
    if value is True:
        return "pld"
    if value is False or value is None:
        return "none"
    if value not in RETRIEVALS:
        raise SettingsError(f"method.retrieval must be one of {', '.join(RETRIEVALS)}, got {value!r}")
    return value


def merge_tree(children: list[list[int]], node_tokens: list[int], tokens: list[int],
               parents: list[int]) -> list[int | None]:
    """Where a retrieved tree goes in a template: for each of its nodes (`parents[i]` indexes
    `tokens`, -1 = the root; parents first), the template node it shares, or None when it is new
    (then it, and all below it, hang below its parent's place)."""
    at: list[int | None] = []
    for tok, par in zip(tokens, parents):
        base = 0 if par < 0 else at[par]
        at.append(None if base is None else next((c for c in children[base] if node_tokens[c] == tok), None))
    return at


def suffix_cells(parents: list[int], probs: list[float]) -> list[int]:
    """Each retrieved node's rate cell: its frequency estimate given its parent (its path estimate over
    its parent's, in SUFFIX_BINS bins) and its depth (1, 2, 3 or more). `parents[i]` indexes the
    nodes, -1 = the root; parents first."""
    cells, depth = [], []
    for par, prob in zip(parents, probs):
        given = prob / probs[par] if par >= 0 and probs[par] > 0 else prob
        depth.append(1 if par < 0 else depth[par] + 1)
        b = min(max(int(given * SUFFIX_BINS), 0), SUFFIX_BINS - 1)
        cells.append((min(depth[-1], SUFFIX_DEPTHS) - 1) * SUFFIX_BINS + b)
    return cells


def retrieved_trials(tokens: list[int], parents: list[int], cont: list[int]) -> list[tuple[int, bool]] | None:
    """(node, accepted) for every drafted node whose parent lay on the decided path (the root's
    children always), or None while `cont`, the tokens decided after the root, cannot settle them."""
    trials, on_path, depth = [], -1, 0
    while True:
        kids = [i for i, par in enumerate(parents) if par == on_path]
        if not kids:
            return trials
        if depth >= len(cont):
            return None if len(cont) < len(tokens) else trials
        nxt = next((i for i in kids if tokens[i] == cont[depth]), None)
        trials += [(i, i == nxt) for i in kids]
        if nxt is None:
            return trials
        on_path, depth = nxt, depth + 1


def merge_chain(children: list[list[int]], node_tokens: list[int], chain: list[int]) -> tuple[list[int], int]:
    """Where a chain goes in a template: (the template nodes its prefix shares, in path order;
    how many of its tokens that prefix covers). The rest of the chain hangs below the last shared
    node (the root when none). `node_tokens[v]`: the token at template node v (0 = root)."""
    shared, node = [], 0
    for tok in chain:
        child = next((c for c in children[node] if node_tokens[c] == tok), None)
        if child is None:
            break
        shared.append(child)
        node = child
    return shared, len(shared)


@dataclass
class FusedTRSettings(AdaptiveTRSettings):
    matrix: bool = True  # the matrix's template as a source (false: retrieval only, still chosen per step)
    # the retrieval source: pld (Prompt Lookup's chain, learnt chain rates; higher MAT than suffix
    # at vLLM's suffix settings on Spec-Bench prompts, see docs/token-recycling.md), suffix (Suffix
    # Decoding's tree, frequency estimates) or none (the matrix only)
    retrieval: str = "pld"
    max_ngram_size: int = 3  # pld: query n-gram sizes tried, from this down to 1 (as PLD)
    num_pred_tokens: int = 10  # pld: tokens after the match (as PLD)
    suffix_depth: int = 24  # suffix: the tree's depth, shared by the match and the draft (vLLM's 24)
    suffix_tokens: int = 16  # suffix: at most this many retrieved nodes per step
    suffix_factor: float = 4.0  # suffix: a match of m tokens drafts at most suffix_factor x m tokens (vLLM: 1; 4 had the higher MAT here)
    suffix_min_prob: float = 0.1  # suffix: nodes whose frequency estimate is below this are not drafted
    suffix_tree: bool = True  # suffix: a tree of the likeliest continuations (false: one path, as vLLM)
    suffix_global: bool = False  # suffix: also a global tree over earlier answers and the running one
    # suffix: each node's acceptance learnt per (frequency estimate given its parent, depth), as the
    # matrix's confidences are, instead of the frequency estimate itself (results/archive/cpu-leaders-suffix-rates)
    suffix_rates: bool = False
    # suffix: whose trees (as Suffix Decoding's method.backend): arctic-inference's, ours (python), or
    # auto, arctic's where it imports; the same drafts but at equally frequent continuations
    suffix_backend: str = "auto"
    max_nodes: int = 80  # node budget of the merged tree per step
    # a node both sources draft is counted apart from the nodes only one drafts, in the matrix's cells
    # and the chain's (false: one rate per cell whatever the other source drafted)
    agreement: bool = True
    # each merged node's estimate scaled by its source's calibration (matrix only, retrieval only, both):
    # the accepted drafted nodes of that source over the sum of their estimates, decayed as the rates
    # are; the chooser's picks are the nodes whose estimates came out highest, so uncorrected they
    # promise more than is accepted (scripts/estimate_calibration.py); off: no faster (docs/token-recycling.md)
    calibrate: bool = False

    def __post_init__(self):
        super().__post_init__()
        retrieval = retrieval_source(self.retrieval)
        if not (self.matrix or retrieval != "none"):
            raise SettingsError("tr_fused needs a source: method.matrix=true or method.retrieval=suffix or pld "
                                "(both off would draft nothing; use method=ar)")
        check_ngram(self.max_ngram_size, self.num_pred_tokens)  # PLD's own bounds
        if self.max_nodes < 1:
            raise SettingsError(f"method.max_nodes must be at least 1, got {self.max_nodes}")
        if self.suffix_depth < 2 or self.suffix_tokens < 1:
            raise SettingsError(f"method.suffix_depth must be at least 2 and method.suffix_tokens at least 1, "
                                f"got {self.suffix_depth} and {self.suffix_tokens}")
        if retrieval == "suffix":
            resolve_backend(self.suffix_backend, "method.suffix_backend")
        if self.suffix_factor <= 0 or not 0 <= self.suffix_min_prob <= 1:
            raise SettingsError(f"method.suffix_factor must be above 0 and method.suffix_min_prob in [0, 1], "
                                f"got {self.suffix_factor} and {self.suffix_min_prob}")


class FusedChoice:
    """`tr_fused`'s chooser: the template's nodes with their estimates (adaptive TR's `GoodputSubtree`,
    `template`) and the retrieved continuation's, merged by common prefixes; the goodput sub-tree of
    the merged tree is verified."""

    drafted: tuple[int, ...] | None = None

    def __init__(self, settings: FusedTRSettings, target, source: Recycling):
        self.settings, self.source, self.tree, self.device = settings, source, source.template, source.device
        self.retrieval = retrieval_source(settings.retrieval)  # the earlier true / false read as pld / none
        # 2: a node both sources draft is counted apart (`agreement`)
        self.agreement_classes = 2 if settings.agreement else 1
        extra = {"suffix": settings.suffix_tokens, "pld": settings.num_pred_tokens}.get(self.retrieval, 0)
        self.template = GoodputSubtree(settings, target, source, self.agreement_classes, extra)
        self.suffix_backend = None
        if self.retrieval == "suffix":
            self.suffix_backend = resolve_backend(settings.suffix_backend, "method.suffix_backend")
            line = backend_line("tr_fused", settings.suffix_backend, self.suffix_backend)
            if line:
                print(line, file=sys.stderr)
        self.reset()

    check_files = staticmethod(GoodputSubtree.check_files)
    keeps_confidences = staticmethod(GoodputSubtree.keeps_confidences)

    def reset(self) -> None:
        self.template.reset()
        self.drafted = None
        self.plain_steps = self.drafted_steps = 0
        # prior: the first chain token right 40% of the time, each later one 70% given its parent
        s = self.settings
        prior = [0.4 if d == 0 else 0.7 for _ in range(self.agreement_classes * NGRAM_CLASSES)
                 for d in range(s.num_pred_tokens)]
        self.chain_rates = RateTable(prior, prior_steps=4, half_life=400)
        # per step with a match: (root's index, chain tokens, n-gram class, how many the template drafts too)
        self._chains: deque = deque()
        self.sources: list[int] = []  # source bits of the drafted nodes, in sub-tree order
        self._subtrees_fused: dict[tuple[int, ...], DraftTree] = {}
        self._accepted_from = [0, 0, 0]  # matrix only, retrieval only, both
        self._retrieval_steps = 0
        self._global_drafts = 0  # suffix_global: steps whose retrieved tree came from the global tree
        self._suffix = suffix_trees(self.suffix_backend or "python", s.suffix_depth,
                                    SUFFIX_CACHED if s.suffix_global else 0, s.suffix_tokens,
                                    float(s.suffix_factor), 0.0, float(s.suffix_min_prob), bool(s.suffix_tree))
        self._suffix_len: int | None = None  # tokens of the running turn in the suffix tree (None: no turn)
        self._suffix_prompt = 0
        # prior: the frequency estimate itself (the bin's middle), worth a few trials
        prior = [(b + 0.5) / SUFFIX_BINS for _ in range(SUFFIX_DEPTHS) for b in range(SUFFIX_BINS)]
        self.suffix_rates = RateTable(prior, prior_steps=4, half_life=400)
        self._retrieved: deque = deque()  # per step with a suffix draft: (root's index, tokens, parents, cells)
        # calibrate: per source (cell = source bits - 1), accepted drafted nodes against their estimates
        self.calibration = RateTable([1.0, 1.0, 1.0], prior_steps=4, half_life=400)
        self._estimates: list[float] = []  # the drafted nodes' estimates before calibration

    # -- suffix retrieval ------------------------------------------------------------------------
    def _suffix_draft(self, state: DecodeState) -> tuple[list[int], list[int], list[float]]:
        """The suffix trees' best continuation of the context: (tokens, parents, frequency estimates).
        The trees follow the decided tokens (a new turn at step 0: the last turn's answer closes)."""
        seq = state.tokens.numpy()  # numpy's slices: a torch slice costs several of them after a CPU forward
        if state.step == 0 or self._suffix_len is None:
            if self._suffix_len is not None:
                self._suffix.end_turn(self._suffix.turn_tokens[self._suffix_prompt :].copy())
            self._suffix.start_turn(seq[: state.prompt_len])
            self._suffix_len = self._suffix_prompt = state.prompt_len
        if len(seq) > self._suffix_len:
            self._suffix.extend(seq[self._suffix_len :])
            self._suffix_len = len(seq)
        spec, where = self._suffix.speculate(seq[-self.settings.suffix_depth :])
        if spec.tokens and where == "global":
            self._global_drafts += 1
        if not spec.tokens or not self.settings.suffix_rates:
            return spec.tokens, spec.parents, spec.probs
        cells = suffix_cells(spec.parents, spec.probs)
        self._retrieved.append((len(seq) - 1, spec.tokens, spec.parents, cells))
        rate = self.suffix_rates.rate  # the tree's cells alone, not every cell's (the table changes each step)
        probs: list[float] = []
        for par, cell in zip(spec.parents, cells):
            probs.append(rate(cell) * (probs[par] if par >= 0 else 1.0))
        return spec.tokens, spec.parents, probs

    def _learn_retrieved(self, seq: np.ndarray) -> None:
        """Each drafted suffix node whose parent was right is a trial of its cell, decided once the
        tokens after its step reach the tree's depth."""
        while self._retrieved:
            root_at, tokens, parents, cells = self._retrieved[0]
            cont = seq[root_at + 1 : root_at + 1 + len(tokens)].tolist()
            trials = retrieved_trials(tokens, parents, cont)
            if trials is None:
                return  # not decided yet (and later drafts even less)
            self._retrieved.popleft()
            for i, hit in trials:
                self.suffix_rates.add(cells[i], hit)
            self.suffix_rates.next_step()

    def _pld_chain(self, state: DecodeState) -> tuple[list[int], int]:
        """Prompt Lookup's chain and its n-gram class (an empty chain without a match)."""
        match = find_match(state.tokens, self.settings.max_ngram_size, self.settings.num_pred_tokens,
                           self.template.host_kernels)
        if match is None:
            return [], 0
        return match[0].tolist(), min(match[1], NGRAM_CLASSES) - 1

    def _chain_probabilities(self, root_at: int, chain: list[int], cls: int, agreed: int) -> list[float]:
        """Each chain token's learnt estimate of being accepted (its first `agreed` tokens are template
        nodes too); the chain is remembered, to be learnt from once the tokens after `root_at` decide it."""
        self._chains.append((root_at, chain, cls, agreed))
        rate = self.chain_rates.rate  # the chain's cells alone
        chain_p, prob = [], 1.0
        for d in range(1, len(chain) + 1):
            prob *= rate(self._chain_cell(cls, d, d <= agreed))
            chain_p.append(prob)
        return chain_p

    def _chain_cell(self, ngram_class: int, depth: int, agreed: bool = False) -> int:
        group = (agreed and self.agreement_classes > 1) * NGRAM_CLASSES + ngram_class
        return group * self.settings.num_pred_tokens + depth - 1

    # -- retrieval statistics --------------------------------------------------------------------
    def _learn_chains(self, seq: np.ndarray) -> None:
        """A chain token at depth d is a trial when the chain was right up to d - 1; decided once a
        token differs from what followed the root or the whole chain is decided."""
        while self._chains:
            root_at, chain, cls, agreed = self._chains[0]
            cont = seq[root_at + 1 : root_at + 1 + len(chain)].tolist()
            right = next((i for i, (a, b) in enumerate(zip(chain, cont)) if a != b), len(cont))
            if right == len(cont) and len(cont) < len(chain):
                return  # not decided yet (and later chains even less)
            self._chains.popleft()
            for d in range(1, min(right + 1, len(chain)) + 1):
                self.chain_rates.add(self._chain_cell(cls, d, d <= agreed), d <= right)
            self.chain_rates.next_step()

    # -- drafting --------------------------------------------------------------------------------
    def propose(self, state: DecodeState) -> Draft | None:
        if state.step == 0:
            self._chains.clear()
            self._retrieved.clear()
        tokens, host_conf, bucket = self.template.prepare(state)
        decided = state.tokens.numpy()  # read through numpy's slices (cheaper after a CPU forward)
        self._learn_chains(decided)
        self._learn_retrieved(decided)
        if self.retrieval == "suffix":
            r_tokens, r_parents, r_probs = self._suffix_draft(state)
        elif self.retrieval == "pld":
            (r_tokens, cls), r_probs = self._pld_chain(state), None
            r_parents = list(range(-1, len(r_tokens) - 1))
        else:
            r_tokens = r_parents = r_probs = []
        at: list[int | None] = []
        if r_tokens:
            self._retrieval_steps += 1
            # the template's tokens on the host: waits for the copy _prepare started (on an
            # accelerator the step's second synchronisation, and only on steps with a retrieval)
            at = merge_tree(self.tree.children, self.template.template_tokens(), r_tokens, r_parents)
        agreed = frozenset(v for v in at if v is not None) if self.settings.matrix else frozenset()
        if r_probs is None:  # the chain's estimates depend on how much of it the template drafts
            r_probs = (self._chain_probabilities(state.tokens.numel() - 1, r_tokens, cls, len(agreed))
                       if r_tokens else [])
        if self.agreement_classes > 1:
            self.template.agree(agreed)
        n = len(self.tree)
        p = self.template.probabilities(bucket, host_conf, agreed) if self.settings.matrix else [0.0] * n
        p, parents, source, extra = self._merged(p, r_tokens, r_parents, r_probs, at)
        raw = p
        if self.settings.calibrate:
            rate = self.calibration.rate
            matrix = rate(0)
            by_source = (matrix, matrix, rate(1), rate(2))  # source bits -> cell max(bits, 1) - 1
            p = [pv * by_source[src] for pv, src in zip(p, source)]
        # t(w) after the step's cached tokens (the root is not cached yet)
        nodes = self.template.choose(p, parents, state.tokens.numel() - 1, self.settings.max_nodes)
        self.drafted = nodes
        self.sources = [source[v - 1] for v in nodes]
        self._estimates = [raw[v - 1] for v in nodes]
        if not nodes:
            self.plain_steps += 1
            return None
        self.drafted_steps += 1
        sub = subtree_parents(nodes, parents)
        tree = self._subtrees_fused.get(sub)
        if tree is None:
            if len(self._subtrees_fused) > 1024:
                self._subtrees_fused.clear()
            tree = self._subtrees_fused[sub] = DraftTree(sub)
        node_probs = [p[v - 1] for v in nodes]
        if self.template.on_host:  # the template's tokens are on the host already: one small tensor of the picks
            template = self.template.template_tokens()
            size = len(template)  # the root and the template's nodes; the retrieved ones come after them
            picked = np.array([template[v] if v < size else extra[v - size] for v in nodes], dtype=np.int64)
            # through numpy: torch.tensor of a list costs twice as much, most of it after a forward's sweep
            return Draft(tokens=torch.from_numpy(picked), tree=tree, node_probs=node_probs)
        # the chain's new tokens and the chosen nodes' indices reach the device in one queued copy
        sent = to_device([*extra, *nodes], self.device, torch.long)
        if extra:
            tokens = torch.cat([tokens, sent[: len(extra)]])
        return Draft(tokens=tokens[sent[len(extra):]], tree=tree, node_probs=node_probs)

    def _merged(self, p: list[float], r_tokens: list[int], r_parents: list[int], r_probs: list[float],
                at: list[int | None]) -> tuple[list[float], list[int], list[int], list[int]]:
        """The template's nodes (estimates `p`) with the retrieved ones merged in: (every node's estimate,
        parent and source bits; the retrieved tokens the template lacks, in merged-node order). A shared
        node keeps the larger estimate; a new one hangs below its parent's place (`at`: merge_tree's)."""
        parents = list(self.tree.parents)
        source = [MATRIX if self.settings.matrix else 0] * len(self.tree)
        extra: list[int] = []
        place: list[int] = []  # each retrieved node's id in the merged tree
        for tok, par, pv, v in zip(r_tokens, r_parents, r_probs, at):
            if v is not None:  # shared with the template
                p[v - 1] = max(p[v - 1], pv)
                source[v - 1] |= RETRIEVAL
            else:
                parents.append(0 if par < 0 else place[par])
                p.append(pv)
                source.append(RETRIEVAL)
                extra.append(tok)
                v = len(parents)
            place.append(v)
        return p, parents, source, extra

    # -- statistics ------------------------------------------------------------------------------
    def note(self, outcome: StepOutcome) -> None:
        """The sources of the accepted tokens (TR's template-node statistics: the matrix's own count)."""
        self.template.note(outcome)  # the step's forward time, for online_cost
        for a in outcome.accepted:
            self._accepted_from[{MATRIX: 0, RETRIEVAL: 1}.get(self.sources[a - 1], 2)] += 1
        if outcome.draft is not None and self.settings.calibrate:
            hits, mass = [0.0] * 3, [0.0] * 3
            accepted = set(outcome.accepted)
            for i, (src, est) in enumerate(zip(self.sources, self._estimates), start=1):
                hits[max(src, 1) - 1] += i in accepted
                mass[max(src, 1) - 1] += est
            for cell in range(3):
                if mass[cell] > 0:
                    self.calibration.add_counts(cell, hits[cell], mass[cell])
            self.calibration.next_step()

    def take_statistics(self) -> dict:
        out = dict(accepted_from_matrix=self._accepted_from[0], accepted_from_retrieval=self._accepted_from[1],
                   accepted_from_both=self._accepted_from[2], retrieval_steps=self._retrieval_steps,
                   retrieval_source=self.retrieval)
        if self.retrieval == "suffix":
            out["suffix_backend"] = self.suffix_backend
            if self.settings.suffix_global:
                out["retrieval_from_global"] = self._global_drafts
        self._accepted_from = [0, 0, 0]
        self._retrieval_steps = self._global_drafts = 0
        return out


@register("tr_fused")
class FusedTokenRecycling(TokenRecycling):
    """Token Recycling fused with retrieval: the matrix and `FusedChoice`."""

    Settings = FusedTRSettings
    Chooser = FusedChoice

    @classmethod
    def resource_identity(cls, params: dict) -> dict:
        """Whose suffix trees retrieved (retrieval=suffix): the answers are the same, the drafts may differ at ties."""
        if retrieval_source(params.get("retrieval", FusedTRSettings.retrieval)) != "suffix":
            return {}
        return {"suffix_backend": resolve_backend(params.get("suffix_backend", "auto"), "method.suffix_backend")}

"""Token Recycling fused with retrieval: one draft tree from the adjacency matrix and from the context.

Each step, two sources propose continuations of the root:

* the matrix: TR's whole template expanded from the root (specbench/methods/tr.py), each node's
  probability p(v) of being accepted estimated as adaptive TR does;
* retrieval: Prompt Lookup's n-gram continuation from the prompt and the output so far
  (specbench/methods/pld.py), a chain whose d-th token is accepted with probability
  q(1) x ... x q(d), where q(d) is the decayed rate at which a chain token at depth d was right
  when the one before it was, per matched n-gram size (longer matches are more reliable).

The chain is merged into the template by longest common prefix: while its tokens spell a path of
the template, they share those nodes (p = the larger of the two estimates); the rest hangs below
as new nodes. From the merged tree the step verifies the parent-closed node set with the most
expected tokens per second on the cost curve, at most `max_nodes` nodes, or a plain step when
nothing pays (specbench/hardware/goodput.py). So a copy-heavy stretch gets the retrieval chain,
free text the matrix's tree. Lossless by construction (the engine's verifier), and the matrix
learns from every verified row, retrieval rows included.

`matrix=false` or `retrieval=false` switch a source off (for ablations). The statistics of a run
say how many accepted tokens came from each source (`accepted_from_*`: matrix only, retrieval
only, both).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections import deque

import torch

from specbench.decoding.transfers import to_device
from specbench.decoding.tree import DraftTree
from specbench.drafter import TARGET_FACTS, DecodeState, Draft, StepOutcome
from specbench.errors import SettingsError
from specbench.hardware.goodput import RateTable, choose_nodes, subtree_parents
from specbench.methods.pld import PromptLookup, find_match
from specbench.methods.tr import AdaptiveTokenRecycling, AdaptiveTRSettings
from specbench.registry import register

MATRIX, RETRIEVAL = 1, 2  # source bits of a merged node
NGRAM_CLASSES = 3  # matched n-gram size 1, 2, 3 or more


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
    retrieval: bool = True  # Prompt Lookup's continuation as a source (false: tr_adaptive)
    max_ngram_size: int = 3  # retrieval: query n-gram sizes tried, from this down to 1 (as PLD)
    num_pred_tokens: int = 10  # retrieval: tokens after the match (as PLD)
    max_nodes: int = 80  # node budget of the merged tree per step


@register("tr_fused")
class FusedTokenRecycling(AdaptiveTokenRecycling):
    Settings = FusedTRSettings

    def __init__(self, target=None, settings: FusedTRSettings | None = None, **values):
        # the sources are set before the parent builds (its reset() reads them)
        s = settings if settings is not None else FusedTRSettings(
            **{k: v for k, v in values.items() if k not in TARGET_FACTS})
        self._check(s.matrix, s.retrieval, s.max_ngram_size, s.num_pred_tokens, s.max_nodes)
        self.use_matrix, self.use_retrieval = bool(s.matrix), bool(s.retrieval)
        self.max_ngram_size, self.num_pred_tokens = int(s.max_ngram_size), int(s.num_pred_tokens)
        self.max_nodes = int(s.max_nodes)
        super().__init__(target, s, **{k: v for k, v in values.items() if k in TARGET_FACTS})
        self.step_times = self.curve.table(self.tree.size + self.num_pred_tokens)

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        p = super().check_settings(params, target)
        cls._check(p["matrix"], p["retrieval"], p["max_ngram_size"], p["num_pred_tokens"], p["max_nodes"])
        return p

    @staticmethod
    def _check(matrix, retrieval, max_ngram_size, num_pred_tokens, max_nodes) -> None:
        if not (matrix or retrieval):
            raise SettingsError("tr_fused needs a source: method.matrix=true or method.retrieval=true "
                                "(both false would draft nothing; use method=ar)")
        PromptLookup._check(max_ngram_size, num_pred_tokens)
        if max_nodes < 1:
            raise SettingsError(f"method.max_nodes must be at least 1, got {max_nodes}")

    def reset(self) -> None:
        super().reset()
        # prior: the first chain token right 40% of the time, each later one 70% given its parent
        prior = [0.4 if d == 0 else 0.7 for _ in range(NGRAM_CLASSES) for d in range(self.num_pred_tokens)]
        self.chain_rates = RateTable(prior, prior_steps=4, half_life=400)
        self._chains: deque = deque()  # per step with a match: (root's index, chain tokens, n-gram class)
        self._sources: list[int] = []  # source bits of the drafted nodes, in sub-tree order
        self._subtrees_fused: dict[tuple[int, ...], DraftTree] = {}
        self._accepted_from = [0, 0, 0]  # matrix only, retrieval only, both
        self._retrieval_steps = 0

    def _chain_cell(self, ngram_class: int, depth: int) -> int:
        return ngram_class * self.num_pred_tokens + depth - 1

    # -- retrieval statistics --------------------------------------------------------------------
    def _learn_chains(self, seq: torch.Tensor) -> None:
        """A chain token at depth d is a trial when the chain was right up to d - 1; decided once a
        token differs from what followed the root or the whole chain is decided."""
        while self._chains:
            root_at, chain, cls = self._chains[0]
            cont = seq[root_at + 1 : root_at + 1 + len(chain)].tolist()
            right = next((i for i, (a, b) in enumerate(zip(chain, cont)) if a != b), len(cont))
            if right == len(cont) and len(cont) < len(chain):
                return  # not decided yet (and later chains even less)
            self._chains.popleft()
            for d in range(1, min(right + 1, len(chain)) + 1):
                self.chain_rates.add(self._chain_cell(cls, d), d <= right)
            self.chain_rates.next_step()

    # -- drafting --------------------------------------------------------------------------------
    def propose(self, state: DecodeState) -> Draft | None:
        if state.step == 0:
            self._chains.clear()
        tokens, host_conf, bucket = self._prepare(state)
        self._learn_chains(state.tokens)
        n = len(self.tree)
        p = self._probabilities(bucket, host_conf) if self.use_matrix else [0.0] * n
        parents = list(self.tree.parents)
        source = [MATRIX if self.use_matrix else 0] * n
        extra: list[int] = []
        match = find_match(state.tokens, self.max_ngram_size, self.num_pred_tokens) if self.use_retrieval else None
        if match is not None:
            chain, size = match[0].tolist(), match[1]
            cls = min(size, NGRAM_CLASSES) - 1
            self._chains.append((state.tokens.numel() - 1, chain, cls))
            self._retrieval_steps += 1
            rates = self.chain_rates.rates()
            chain_p, prob = [], 1.0
            for d in range(1, len(chain) + 1):
                prob *= rates[self._chain_cell(cls, d)]
                chain_p.append(prob)
            # the template's tokens on the host: waits for the copy _prepare started (on an
            # accelerator the step's second synchronisation, and only on steps with a match)
            shared, covered = merge_chain(self.tree.children, self._last[1].tolist(), chain)
            for v, pv in zip(shared, chain_p):
                p[v - 1] = max(p[v - 1], pv)
                source[v - 1] |= RETRIEVAL
            below = shared[-1] if shared else 0
            for tok, pv in zip(chain[covered:], chain_p[covered:]):
                parents.append(below)
                p.append(pv)
                source.append(RETRIEVAL)
                extra.append(tok)
                below = len(parents)
        nodes = choose_nodes(p, parents, self.step_times, self.min_gain, self.max_nodes)
        self._drafted = nodes
        self._sources = [source[v - 1] for v in nodes]
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
        # the chain's new tokens and the chosen nodes' indices reach the device in one queued copy
        sent = to_device([*extra, *nodes], self.device, torch.long)
        if extra:
            tokens = torch.cat([tokens, sent[: len(extra)]])
        return Draft(tokens=tokens[sent[len(extra):]], tree=tree, node_probs=[p[v - 1] for v in nodes])

    # -- statistics ------------------------------------------------------------------------------
    def _count(self, outcome: StepOutcome, root_unwritten: torch.Tensor, rank0_hit: torch.Tensor) -> None:
        """TR's template-node statistics, and the sources of the accepted tokens."""
        for a in outcome.accepted:
            self._accepted_from[{MATRIX: 0, RETRIEVAL: 1}.get(self._sources[a - 1], 2)] += 1
        super()._count(outcome, root_unwritten, rank0_hit)

    def take_statistics(self) -> dict:
        out = super().take_statistics()
        out.update(accepted_from_matrix=self._accepted_from[0], accepted_from_retrieval=self._accepted_from[1],
                   accepted_from_both=self._accepted_from[2], retrieval_steps=self._retrieval_steps)
        self._accepted_from = [0, 0, 0]
        self._retrieval_steps = 0
        return out

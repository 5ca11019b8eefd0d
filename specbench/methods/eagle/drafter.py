"""EAGLE (Li et al. 2024) with EAGLE-2's dynamic draft tree (Li et al. 2024b; SafeAILab/EAGLE).

A one-layer draft head (head.py) extrapolates the target's features. Its KV cache holds decided
positions only, fed with the target's features (the `observe` hook, and the prompt's in the first
proposal of a turn, so that work is timed), so a rejected branch needs no rollback. `tree=dynamic`
(default): EAGLE-2's tree, expanded `depth` times from the `top_k` most confident nodes of the newest
level, then reranked to the best `total_tokens - 1`; `tree=static`: EAGLE-1's choices list
(mc_sim_7b_63). The target side is the engine's: one tree forward, its verification, its KV
compaction. Details: docs/eagle.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specbench.decoding.transfers import to_device
from specbench.draft import DraftTree, DecodeState, Draft, StepOutcome
from specbench.drafter import Drafter, ReadsHiddenStates
from specbench.errors import SettingsError
from specbench.drafting.choices import load_choices, tree_from_choices
from specbench.methods.eagle.head import EagleHeadError, HeadCache, check_head_dir, load_head, resolve_head_dir
from specbench.registry import register

TREES = ("dynamic", "static")


@dataclass
class EagleSettings:
    """EAGLE-2's published settings (total_token 60, depth 5, top_k 10). `head`: default = the head for
    this model (data/eagle/smollm2-135m for the embedded SmolLM2, trained with scripts/train_eagle.py;
    the published EAGLE heads for vicuna-7b/13b/33b and llama-2-7b-chat), else a directory in the
    published layout or a hub id."""

    head: str = "default"
    tree: str = "dynamic"  # dynamic: EAGLE-2's tree; static: EAGLE-1's tree of `choices`
    total_tokens: int = 60  # dynamic: rows of the verification forward, root included
    depth: int = 5  # dynamic: levels expanded after the first (drafts reach depth + 1 tokens)
    top_k: int = 10  # dynamic: children per expanded node, and nodes expanded per level
    choices: Any = "mc_sim_7b_63"  # static: a tree in data/medusa/medusa_trees.json, a JSON file or rank paths

    def __post_init__(self):
        if self.tree not in TREES:
            raise SettingsError(f"method.tree must be one of {', '.join(TREES)} (EAGLE-2's dynamic tree or "
                                f"EAGLE-1's static one), got {self.tree!r}")
        if self.total_tokens < 2:
            raise SettingsError(f"method.total_tokens must be at least 2 (the root and one draft token), "
                                f"got {self.total_tokens}")
        if self.depth < 0 or self.top_k < 1:
            raise SettingsError(f"method.depth must be >= 0 and method.top_k >= 1, got depth={self.depth}, "
                                f"top_k={self.top_k}")


class _DraftRows:
    """The head's rows of one draft: their keys and values (attended to by deeper rows, never kept)."""

    def __init__(self):
        self.kv: list | None = None
        self.count = 0

    def add(self, kv: list) -> None:
        self.kv = kv if self.kv is None else [(torch.cat([a, k], 1), torch.cat([b, v], 1))
                                               for (a, b), (k, v) in zip(self.kv, kv)]
        self.count += kv[0][0].shape[1]


@dataclass
class _StaticLevel:
    """One level of EAGLE-1's fixed tree, worked out once: which nodes it holds, the parents whose
    scores pick their tokens, and, for the nodes with children, the draft rows each one sees."""

    nodes: list[int]
    parent_ids: list[int]  # distinct parents, in order
    parent_slot: list[int]  # per node: its parent's index in parent_ids
    expand: list[int]  # nodes with children: a head forward each
    ancestors: torch.Tensor  # (len(expand), draft rows before this level): the rows of each one's ancestors


def static_levels(choices, device) -> list[_StaticLevel]:
    tree, levels, row_of = choices.tree, [], {}
    depths = tree.depths.tolist()
    for level in range(1, choices.depth + 1):
        nodes = [i for i in range(1, tree.size) if depths[i] == level]
        parents = [tree.parents[i - 1] for i in nodes]
        parent_ids = sorted(set(parents))
        expand = [i for i in nodes if tree.children[i]]
        ancestors = torch.zeros(len(expand), len(row_of), dtype=torch.bool)
        for r, i in enumerate(expand):
            for a in tree.path_to(i)[:-1]:
                ancestors[r, row_of[a]] = True
        for i in expand:
            row_of[i] = len(row_of)
        levels.append(_StaticLevel(nodes, parent_ids, [parent_ids.index(p) for p in parents], expand,
                                   to_device(ancestors, device)))
    return levels


@register("eagle")
class Eagle(Drafter, ReadsHiddenStates):
    Settings = EagleSettings

    def __init__(self, target=None, settings: EagleSettings | None = None, **values):
        super().__init__(target, settings, **values)
        s, model = self.settings, self.target.model
        if model is None:
            raise EagleHeadError("EAGLE needs the target model (its embedding and lm_head)")
        self.embed = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        weight = self.lm_head.weight
        head = load_head(resolve_head_dir(s.head, self.target.model_name), self.embed.weight)
        if head.config.hidden_size != weight.shape[1]:
            raise EagleHeadError(f"the EAGLE head's hidden size is {head.config.hidden_size}, model "
                                 f"'{self.target.model_name}' has {weight.shape[1]}: pass method.head=<a head "
                                 f"trained for this model>")
        self.head = head.to(device=weight.device, dtype=weight.dtype)
        self.device = weight.device
        self.top_k = min(int(s.top_k), weight.shape[0])
        self.static = tree_from_choices(load_choices(s.choices)) if s.tree == "static" else None
        self.static_levels = static_levels(self.static, self.device) if self.static is not None else None
        self.start_question()

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        p = super().check_settings(params, target)
        if p["tree"] == "static":
            tree_from_choices(load_choices(p["choices"]))
        directory = resolve_head_dir(p["head"], target.get("model_name"), download=False)
        if directory is not None:
            check_head_dir(directory)
        return p

    def start_question(self) -> None:
        self._cache: HeadCache | None = None
        self._pending: list[torch.Tensor] = []  # target features of decided positions the head has not read

    def observe_prefill(self, hidden: torch.Tensor) -> None:
        self._cache = HeadCache(self.head)  # a turn's prompt is prefilled whole: the head starts over
        self._pending = [hidden]

    def observe(self, outcome: StepOutcome) -> None:
        rows = [0] + outcome.accepted  # the root's and the accepted nodes' features, in path order
        index = to_device(torch.tensor(rows), outcome.hidden_states.device)
        self._pending.append(outcome.hidden_states.index_select(0, index))

    def _run(self, features, tokens, positions, visible, rows: _DraftRows | None = None):
        """One head forward; rows=None: decided positions, kept in the cache; else draft rows."""
        out, kv = self.head(features, self.embed(tokens), positions, visible, self._cache,
                            None if rows is None else rows.kv)
        if rows is None:
            self._cache.append([k for k, _ in kv], [v for _, v in kv])
        else:
            rows.add(kv)
        return out

    def _log_probs(self, features: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.lm_head(features).float(), dim=-1)

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Draft | None:
        if self._cache is None or not self._pending:
            return None
        dev = self.device
        tokens = state.tokens
        root_pos = tokens.numel() - 1
        # read what was decided since the last proposal: row t pairs f_t with x_{t+1}
        features = torch.cat(self._pending)
        self._pending = []
        start = self._cache.length
        n = features.shape[0]
        if start + n != root_pos:
            raise RuntimeError(f"EAGLE head out of step: {start} cached + {n} new rows, root at {root_pos}")
        ids = to_device(tokens[start + 1 : root_pos + 1], dev)
        visible = torch.ones(n, start + n, dtype=torch.bool, device=dev).tril(start)
        out = self._run(features, ids, torch.arange(start, root_pos, device=dev), visible)
        root_feature = out[-1:]  # the head's f_{root}, which scores the root's children
        if self.static is not None:
            return self._static_draft(root_feature, root_pos)
        return self._dynamic_draft(root_feature, root_pos)

    def _expand(self, rows: _DraftRows, features, tokens, position: int, ancestors: torch.Tensor):
        """Head forward over draft nodes at one level: `ancestors` (nodes, rows.count) says which earlier
        draft rows each node sees; every node sees the whole cache and itself."""
        dev, n = self.device, tokens.numel()
        visible = torch.cat([torch.ones(n, self._cache.length, dtype=torch.bool, device=dev), ancestors,
                             torch.eye(n, dtype=torch.bool, device=dev)], dim=1)
        return self._run(features, tokens, torch.full((n,), position, device=dev), visible, rows)

    def _dynamic_draft(self, root_feature: torch.Tensor, root_pos: int) -> Draft:
        k, dev = self.top_k, self.device
        scores, tokens = self._log_probs(root_feature)[0].topk(k)
        all_scores, all_tokens = [scores], [tokens]
        all_parents = [torch.full((k,), -1, device=dev)]  # candidate ids; -1 = the root
        frontier = torch.arange(k, device=dev)  # candidate ids of the level to expand
        feats = root_feature.expand(k, -1)
        seen = torch.zeros(k, 0, dtype=torch.bool, device=dev)  # frontier x draft rows: its ancestors' rows
        rows, base = _DraftRows(), k
        for level in range(self.settings.depth):
            out = self._expand(rows, feats, tokens, root_pos + level, seen)
            seen = torch.cat([seen, torch.eye(k, dtype=torch.bool, device=dev)], dim=1)  # now with themselves
            child_scores, child_tokens = self._log_probs(out).topk(k, dim=-1)  # (k, k)
            cumulative = (scores[:, None] + child_scores).flatten()
            all_scores.append(cumulative)
            all_tokens.append(child_tokens.flatten())
            all_parents.append(frontier.repeat_interleave(k))
            scores, best = cumulative.topk(k)
            parent_slot = best // k
            frontier = base + best
            tokens = child_tokens.flatten()[best]
            feats = out[parent_slot]
            seen = seen[parent_slot]
            base += k * k
        return self._rerank(torch.cat(all_scores), torch.cat(all_tokens), torch.cat(all_parents))

    def _rerank(self, scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> Draft:
        """The best total_tokens - 1 candidates by confidence, as a tree in candidate order. The one
        device-to-host copy of a proposal: the candidates' scores and parents."""
        host = torch.stack([scores, parents.to(scores.dtype)]).cpu()
        order = torch.sort(-host[0], stable=True).indices  # ties: the parent (a lower id) first
        keep = sorted(order[: self.settings.total_tokens - 1].tolist())
        node_of, tree_parents, chosen = {-1: 0}, [], []
        for cand in keep:
            parent = int(host[1, cand])
            if parent not in node_of:  # only on an exact tie lost by the parent: drop the orphan
                continue
            tree_parents.append(node_of[parent])
            chosen.append(cand)
            node_of[cand] = len(chosen)
        index = to_device(torch.tensor(chosen), tokens.device)
        # the draft head's path probabilities: what a batch policy ranks this tree's nodes by
        probs = host[0, chosen].exp().tolist()
        return Draft(tokens=tokens.index_select(0, index), tree=DraftTree(tree_parents), node_probs=probs)

    def _static_draft(self, root_feature: torch.Tensor, root_pos: int) -> Draft:
        """EAGLE-1: node i takes rank ranks[i] of its parent's head scores; one forward per level."""
        choices = self.static
        tree = choices.tree
        width = max(choices.ranks) + 1
        node_tokens = [None] * tree.size
        level_out = {0: root_feature}
        rows = _DraftRows()
        for level, plan in enumerate(self.static_levels, start=1):
            # the parents' top tokens: one lm_head over the parents' outputs
            top = self._log_probs(torch.cat([level_out[p] for p in plan.parent_ids])).topk(width, dim=-1).indices
            for i, slot in zip(plan.nodes, plan.parent_slot):
                node_tokens[i] = top[slot, choices.ranks[i - 1]]
            if not plan.expand:  # only nodes with children need a forward
                continue
            feats = torch.cat([level_out[tree.parents[i - 1]] for i in plan.expand])
            out = self._expand(rows, feats, torch.stack([node_tokens[i] for i in plan.expand]), root_pos + level - 1,
                               plan.ancestors)
            for r, i in enumerate(plan.expand):
                level_out[i] = out[r : r + 1]
        return Draft(tokens=torch.stack(node_tokens[1:]), tree=tree)

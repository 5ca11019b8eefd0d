"""Medusa (Cai et al. 2024; FasterDecoding/Medusa): extra heads on the base model draft a token tree.

Head k reads the hidden state of the row whose logits chose the current root (the last accepted
row of the previous verification, or the prompt's last position after the prefill) and predicts
the token k+1 places after the root. A choices list (default mc_sim_7b_63: 63 nodes, depth 4) says
which of each head's top-k tokens to combine: node [r0, r1] is head 0's rank r0 followed by head
1's rank r1. All nodes at one depth draw from the same head at the same row; only the tree shape
makes them a tree. Verification is the engine's: greedy acceptance keeps the output identical to
AR. Typical acceptance (`typical=true`) is Medusa's lossy option; see `override_targets`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from specbench.decoding.transfers import to_device
from specbench.decoding.verify import TreeTensors
from specbench.draft import DecodeState, Draft, StepOutcome
from specbench.drafter import Drafter, OverridesTargets, ReadsHiddenStates
from specbench.drafting.choices import load_choices, tree_from_choices
from specbench.methods.medusa.heads import MedusaHeadsError, check_heads_dir, load_heads, resolve_heads_dir
from specbench.registry import register


@dataclass
class MedusaSettings:
    """Spec-Bench's settings: Medusa-1 heads, tree mc_sim_7b_63, greedy. `heads`: default = the heads
    for this model (data/medusa/smollm2-135m for the embedded SmolLM2, trained with
    scripts/train_medusa.py; FasterDecoding's published heads for vicuna-7b/13b/33b), else a directory
    with config.json + medusa_lm_head.pt, or a hub id."""

    heads: str = "default"
    choices: Any = "mc_sim_7b_63"  # a tree in data/medusa/medusa_trees.json, a JSON file, or a list of rank paths
    num_heads: Optional[int] = None  # the first N heads of the checkpoint (None: all); must cover the tree
    # Typical acceptance (Medusa's lossy option): accept a draft token whose probability at temperature
    # typical_temperature exceeds min(posterior_threshold, posterior_alpha * exp(-entropy)).
    typical: bool = False
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    typical_temperature: float = 0.7

    def __post_init__(self):
        if self.typical and self.typical_temperature <= 0:
            raise MedusaHeadsError("method.typical_temperature must be positive for typical acceptance")


def check_heads_cover(depth: int, heads: int | None) -> None:
    """The tree's depth within the heads it can draw on (`heads` None: not known before loading)."""
    if heads is not None and heads < depth:
        raise MedusaHeadsError(f"the Medusa tree is {depth} deep but only {heads} head(s) are used; "
                               f"use a shallower method.choices or raise method.num_heads")


@register("medusa")
class Medusa(Drafter, ReadsHiddenStates, OverridesTargets):
    Settings = MedusaSettings

    def __init__(self, target=None, settings: MedusaSettings | None = None, **values):
        super().__init__(target, settings, **values)
        s, t = self.settings, self.target
        vocab_size, model, model_name = t.vocab_size, t.model, t.model_name
        heads, choices, num_heads, typical = s.heads, s.choices, s.num_heads, s.typical
        posterior_threshold, posterior_alpha = s.posterior_threshold, s.posterior_alpha
        typical_temperature = s.typical_temperature
        if model is None:
            raise MedusaHeadsError("Medusa needs the base model (its lm_head and hidden size)")
        self.choices = tree_from_choices(load_choices(choices))
        depth = self.choices.depth
        self.heads = load_heads(resolve_heads_dir(heads, model_name), num_heads)
        check_heads_cover(depth, self.heads.num_heads)
        lm_head = model.get_output_embeddings().weight
        if self.heads.hidden_size != lm_head.shape[1] or self.heads.vocab_size not in (0, vocab_size):
            raise MedusaHeadsError(
                f"Medusa heads (hidden {self.heads.hidden_size}, vocabulary {self.heads.vocab_size}) do not fit "
                f"model '{model_name}' (hidden {lm_head.shape[1]}, vocabulary {vocab_size}); pass "
                f"method.heads=<heads trained for this model>")
        self.heads.to(device=lm_head.device, dtype=lm_head.dtype)
        if self.heads.shared_projection:
            self.heads.set_shared_projection(lm_head)
        # Heads beyond the tree's depth would cost a vocabulary projection each for nothing.
        self._used_heads = depth
        width = max(self.choices.topk_per_head())
        # Flat index of every node's token in the (depth, width) table of per-head top-k tokens.
        self._gather = torch.tensor([h * width + r for h, r in zip(self.choices.heads, self.choices.ranks)],
                                    device=lm_head.device)
        self._width = width
        self.tree = self.choices.tree
        self.typical = bool(typical)
        self.lossless = not self.typical  # typical acceptance accepts tokens the target would not pick
        self.posterior_threshold = float(posterior_threshold)
        self.posterior_alpha = float(posterior_alpha)
        self.typical_temperature = float(typical_temperature)
        self._hidden: torch.Tensor | None = None  # (1, hidden) of the row that chose the root

    @classmethod
    def check_settings(cls, params: dict, target: dict) -> dict:
        """The choices tree, and a local heads directory's config and weights file (not read); heads
        given as a hub id are fetched, and checked, when the drafter is built."""
        p = super().check_settings(params, target)
        depth = tree_from_choices(load_choices(p["choices"])).depth
        directory = resolve_heads_dir(p["heads"], target.get("model_name"), download=False)
        if directory is not None:
            check_heads_cover(depth, check_heads_dir(directory, p["num_heads"])[1])
        return p

    def start_question(self) -> None:
        self._hidden = None

    def _tree_tensors(self, tree, device) -> TreeTensors:
        """The draft tree's index tensors on the device, made once (the tree is fixed)."""
        if getattr(self, "_tt", None) is None or self._tt[0] is not tree:
            self._tt = (tree, TreeTensors(tree, device))
        return self._tt[1]

    def observe_prefill(self, last_hidden: torch.Tensor) -> None:
        self._hidden = last_hidden[-1:]

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Draft | None:
        if self._hidden is None:
            return None
        logits = self.heads(self._hidden[0], self._used_heads)  # (depth, vocab)
        table = logits.topk(self._width, dim=-1).indices  # (depth, width)
        return Draft(tokens=table.flatten()[self._gather], tree=self.tree)

    def observe(self, outcome: StepOutcome) -> None:
        # The next root was chosen by the last accepted row's logits; its hidden state feeds the heads.
        row = outcome.accepted[-1] if outcome.accepted else 0
        self._hidden = outcome.hidden_states[row : row + 1]

    def override_targets(self, draft: Draft, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Typical acceptance (Medusa's posterior_threshold / posterior_alpha), expressed as targets.

        `logits` are the tree rows (root first), `targets` the engine's choice at each row. A node is
        plausible when its token's probability under its parent's row, at `typical_temperature`,
        exceeds min(threshold, alpha * exp(-entropy of that row)). Among the nodes whose whole path
        is plausible, the deepest wins (ties: the highest path log-likelihood), as in Medusa's
        evaluate_posterior. Setting each ancestor's target to the next token on that path makes the
        engine's ordinary verification accept exactly this path; the bonus token stays the engine's
        own choice at the last accepted row. Greedy mode returns `targets` untouched. Everything stays
        on the device (no host sync). The engine calls it for lossy drafters only.
        """
        if not self.typical:
            return targets
        tree = draft.tree
        dev = logits.device
        tt = self._tree_tensors(tree, dev)
        as_list = isinstance(targets, list)
        targets = torch.as_tensor(targets, device=dev).clone()
        logp = torch.log_softmax(logits[: tree.size].float() / self.typical_temperature, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
        threshold = (self.posterior_alpha * torch.exp(-entropy)).clamp(max=self.posterior_threshold)
        tokens = to_device(draft.tokens, dev)
        node_logp = torch.cat([logp.new_zeros(1), logp[tt.parents, tokens]])  # root first
        plausible = torch.cat([torch.ones_like(node_logp[:1], dtype=torch.bool),
                               node_logp[1:].exp() > threshold[tt.parents]])
        path_ok = ~(tt.ancestors & ~plausible[None, :]).any(dim=1)  # row i: i and its ancestors plausible
        path_logp = (tt.ancestors.float() * node_logp[None, :]).sum(dim=1)
        # Deepest first, then likelihood: plausible paths have log p > -12 per node (threshold >=
        # alpha / vocab), so a depth step of 1e4 dominates any likelihood difference.
        score = (tt.depths * 1e4 + path_logp).masked_fill(~path_ok, -float("inf"))
        on_path = tt.ancestors[score.argmax()][1:]  # draft nodes on the chosen path (none: the root only)
        # each row whose child is on the path targets that child's token; other rows keep theirs.
        # Written as a product with the parent table, not a mask index, so nothing is read back.
        child_of = on_path[None, :] & (tt.parents[None, :] == tt.node_ids[:, None])  # (rows, nodes)
        chosen = (child_of.long() * tokens[None, :]).sum(dim=1)
        targets = torch.where(child_of.any(dim=1), chosen, targets)
        return targets.tolist() if as_list else targets

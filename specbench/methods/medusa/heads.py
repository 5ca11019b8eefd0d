"""Medusa heads (Cai et al. 2024, FasterDecoding/Medusa): the module and its checkpoint I/O.

A head k reads the base model's last hidden state h_t (after the final norm, the input of lm_head)
and predicts the token at t+k+2, i.e. k+1 tokens past the base model's own next token:

    logits_k = P_k (r_k),  r_k = ResBlock^L(h_t),  ResBlock(x) = x + SiLU(W x + b),  W zero-initialised

so a fresh head is the identity followed by its projection P_k. Published Medusa-1 checkpoints
(`medusa_lm_head.pt` + `config.json` with medusa_num_heads / medusa_num_layers) store the state dict
of an `nn.ModuleList` of `nn.Sequential(ResBlock x L, Linear(hidden, vocab, bias=False))`, so the keys
are `{head}.{layer}.linear.weight|bias` and `{head}.{L}.weight` for the projection. Our compact
checkpoints use the same keys in `medusa_lm_head.safetensors` and may leave the projections out
(config `"shared_projection": true`): every head then reuses the base model's lm_head.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specbench.errors import SpecbenchError
from specbench.drafting.checkpoint import CONFIG_FILE, CheckpointKind

ROOT = Path(__file__).resolve().parents[3]
WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")  # ours; the published heads ship the .pt

# method.heads=default: heads shipped with the repository for the embedded model; for Vicuna v1.3
# the Medusa-1 heads FasterDecoding published (the ones Spec-Bench evaluates).
DEFAULT_HEADS = {
    "smollm2-135m": str(ROOT / "data" / "medusa" / "smollm2-135m"),
    "vicuna-7b": "FasterDecoding/medusa-vicuna-7b-v1.3",
    "vicuna-13b": "FasterDecoding/medusa-vicuna-13b-v1.3",
    "vicuna-33b": "FasterDecoding/medusa-vicuna-33b-v1.3",
}


class MedusaHeadsError(SpecbenchError, ValueError):
    """Heads or a choices tree that are missing, malformed or do not fit the model."""


CHECKPOINT = CheckpointKind("Medusa heads", "method.heads", WEIGHT_FILES, "scripts/train_medusa.py",
                            MedusaHeadsError, DEFAULT_HEADS)


class ResBlock(nn.Module):
    """x + SiLU(W x + b) with W zero-initialised, so a fresh block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)  # SiLU(0) = 0: identity at init, whatever the bias init

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """num_heads heads of num_layers ResBlocks each, then a vocabulary projection per head.

    With `shared_projection`, the projection is the base model's lm_head weight (vocab, hidden), held
    by reference (not a parameter of this module, never saved): `set_shared_projection` binds it.
    """

    def __init__(self, num_heads: int, hidden_size: int, vocab_size: int, num_layers: int = 1,
                 shared_projection: bool = False):
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise MedusaHeadsError(f"Medusa needs at least one head of one layer, got {num_heads} x {num_layers}")
        self.num_heads, self.num_layers = num_heads, num_layers
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)]) for _ in range(num_heads))
        self.projections = None if shared_projection else nn.ModuleList(
            nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads))
        self._shared: torch.Tensor | None = None

    @property
    def shared_projection(self) -> bool:
        return self.projections is None

    def set_shared_projection(self, lm_head_weight: torch.Tensor) -> None:
        if tuple(lm_head_weight.shape) != (self.vocab_size, self.hidden_size):
            raise MedusaHeadsError(
                f"the base model's lm_head is {tuple(lm_head_weight.shape)}, the heads expect "
                f"({self.vocab_size}, {self.hidden_size}): these heads were trained for another model")
        self._shared = lm_head_weight

    def init_projections_from(self, lm_head_weight: torch.Tensor) -> None:
        """Medusa-1 starts every head's own projection as a copy of the base model's lm_head."""
        for p in self.projections:
            p.weight.data.copy_(lm_head_weight)

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """(..., hidden) -> (num_heads, ..., vocab) logits of the first `num_heads` heads (default all)."""
        n = self.num_heads if num_heads is None else num_heads
        res = torch.stack([block(hidden) for block in self.blocks[:n]])
        if self.projections is None:
            if self._shared is None:
                raise MedusaHeadsError("shared-projection heads need set_shared_projection(lm_head.weight) first")
            return res @ self._shared.T.to(res.dtype)
        return torch.stack([proj(r) for proj, r in zip(self.projections[:n], res)])

    # ---- published key layout ----

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """Keys as FasterDecoding's medusa_head ModuleList names them (projections only when owned)."""
        out = {}
        for i, block in enumerate(self.blocks):
            for j, res in enumerate(block):
                out[f"{i}.{j}.linear.weight"] = res.linear.weight.detach()
                out[f"{i}.{j}.linear.bias"] = res.linear.bias.detach()
            if self.projections is not None:
                out[f"{i}.{self.num_layers}.weight"] = self.projections[i].weight.detach()
        return out

    def load_published_state_dict(self, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        state = {k.removeprefix("medusa_head."): v for k, v in state.items()}
        mine = self.published_state_dict()
        missing = [k for k in mine if k not in state]
        if missing:
            raise MedusaHeadsError(f"Medusa heads in {source} lack {len(missing)} tensor(s), e.g. '{missing[0]}'; "
                                   f"expected keys like '0.0.linear.weight' (FasterDecoding's layout)")
        for k, dst in mine.items():
            if tuple(state[k].shape) != tuple(dst.shape):
                raise MedusaHeadsError(f"Medusa heads in {source}: '{k}' has shape {tuple(state[k].shape)}, "
                                       f"expected {tuple(dst.shape)}")
            dst.copy_(state[k].to(dst.dtype))  # dst is a detached view of the parameter


@dataclass
class HeadsConfig:
    num_heads: int
    num_layers: int
    shared_projection: bool
    extra: dict


def _read_config(directory: Path) -> HeadsConfig:
    checkpoint = CHECKPOINT.read_config(directory, "medusa_num_heads")
    return HeadsConfig(int(checkpoint["medusa_num_heads"]), int(checkpoint.get("medusa_num_layers", 1)),
                       bool(checkpoint.get("shared_projection", False)), checkpoint)


def check_heads_dir(directory: str | Path, num_heads: int | None = None) -> tuple[HeadsConfig, int]:
    """A heads directory's config.json and weights file, without reading the weights: its config
    and how many heads will be used (`num_heads`, default all)."""
    directory = Path(directory)
    cfg = _read_config(directory)
    CHECKPOINT.weights_file(directory)
    use = cfg.num_heads if num_heads is None else int(num_heads)
    if not 1 <= use <= cfg.num_heads:
        raise MedusaHeadsError(f"method.num_heads={num_heads}, but {directory} holds {cfg.num_heads} heads")
    return cfg, use


def load_heads(directory: str | Path, num_heads: int | None = None) -> MedusaHeads:
    """Read heads from a directory in the published layout (or our compact one), on the CPU in float32.

    `num_heads` keeps the first heads only (a 5-head checkpoint drives a depth-4 tree with 4).
    The hidden and vocabulary sizes come from the tensors themselves.
    """
    directory = Path(directory)
    cfg, use = check_heads_dir(directory, num_heads)
    state = {k.removeprefix("medusa_head."): v for k, v in CHECKPOINT.read_weights(directory).items()}
    if "0.0.linear.weight" not in state:
        raise MedusaHeadsError(f"{directory}: no '0.0.linear.weight' in the weights; not FasterDecoding's layout")
    hidden = state["0.0.linear.weight"].shape[0]
    proj_key = f"0.{cfg.num_layers}.weight"
    if cfg.shared_projection:
        vocab = int(cfg.extra.get("vocab_size", 0))
    elif proj_key in state:
        vocab = state[proj_key].shape[0]
    else:
        raise MedusaHeadsError(f"{directory}: no projection '{proj_key}' and config.json does not say "
                               f"\"shared_projection\": true")
    heads = MedusaHeads(cfg.num_heads, hidden, vocab, cfg.num_layers, cfg.shared_projection)
    heads.load_published_state_dict(state, str(directory))
    if use < cfg.num_heads:
        heads.blocks = heads.blocks[:use]
        if heads.projections is not None:
            heads.projections = heads.projections[:use]
        heads.num_heads = use
    return heads.eval()


def save_heads(heads: MedusaHeads, directory: str | Path, dtype: torch.dtype = torch.float16,
               **config_extra) -> Path:
    """Write config.json + medusa_lm_head.safetensors in the published key layout."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
           "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size,
           "shared_projection": heads.shared_projection, **config_extra}
    (directory / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = {k: v.to(dtype).contiguous().cpu() for k, v in heads.published_state_dict().items()}
    save_file(tensors, str(directory / WEIGHT_FILES[0]))
    return directory


def resolve_heads_dir(heads: str | os.PathLike | None, model_name: str | None,
                      download: bool = True) -> Path | None:
    """`default` (the heads for this model), a local directory, or a Hugging Face hub id (fetched;
    None for one when not `download`)."""
    return CHECKPOINT.resolve(heads, model_name, download)

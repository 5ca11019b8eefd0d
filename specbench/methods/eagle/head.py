"""EAGLE's draft head (Li et al. 2024; SafeAILab/EAGLE): the module, its cache, checkpoint I/O.

From the target's feature f_t (its last hidden state after the final norm, lm_head's input) and the
embedding of the token that followed it, the head predicts the next feature:

    g_{t+1} = Decoder(fc([embed(x_{t+1}); f_t]))        lm_head(g_{t+1}) scores x_{t+2}

Decoder: Llama decoder layers over the head's own KV cache, the first without its input norm, no
final norm; embedding and lm_head are the target's, frozen. Reads and writes the published
checkpoint layout (EAGLE's heads and those of scripts/train_eagle.py; docs/eagle.md lists the keys).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specbench.errors import SpecbenchError
from specbench.drafting.checkpoint import CONFIG_FILE, CheckpointKind

ROOT = Path(__file__).resolve().parents[3]
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # ours; the published heads ship the .bin

# method.head=default: the head trained here for the embedded model; for Vicuna v1.3 and LLaMA-2-Chat
# the heads EAGLE's authors published (the ones Spec-Bench and the TR paper evaluate).
DEFAULT_HEADS = {
    "smollm2-135m": str(ROOT / "data" / "eagle" / "smollm2-135m"),
    "vicuna-7b": "yuhuili/EAGLE-Vicuna-7B-v1.3",
    "vicuna-13b": "yuhuili/EAGLE-Vicuna-13B-v1.3",
    "vicuna-33b": "yuhuili/EAGLE-Vicuna-33B-v1.3",
    "llama-2-7b-chat": "yuhuili/EAGLE-llama2-chat-7B",
}


class EagleHeadError(SpecbenchError, ValueError):
    """A head that is missing, malformed or does not fit the target."""


CHECKPOINT = CheckpointKind("EAGLE head", "method.head", WEIGHT_FILES, "scripts/train_eagle.py", EagleHeadError,
                            DEFAULT_HEADS)


@dataclass
class HeadConfig:
    """The fields of a published head's config.json that shape the module."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    head_dim: int = 0  # 0: hidden_size / num_attention_heads
    bias: bool = True  # fc's bias (EAGLE's config key)
    attention_bias: bool = False
    vocab_size: int = 0

    def __post_init__(self):
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, checkpoint: dict) -> "HeadConfig":
        """From a head checkpoint's config.json."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in checkpoint.items() if k in names and v is not None}
        values.setdefault("num_key_value_heads", checkpoint.get("num_attention_heads"))
        rope = checkpoint.get("rope_parameters") or {}  # transformers 5 writes RoPE's settings here
        if "rope_theta" in rope:
            values.setdefault("rope_theta", rope["rope_theta"])
        scaling = checkpoint.get("rope_scaling") or rope
        if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
            raise EagleHeadError(f"EAGLE head config has RoPE scaling {scaling}; only plain RoPE "
                                 f"(the published Vicuna and LLaMA-2 heads) is supported")
        try:
            return cls(**values)
        except TypeError as e:
            raise EagleHeadError(f"EAGLE head config lacks a field ({e}); expected a LlamaConfig with "
                                 f"hidden_size, intermediate_size, num_attention_heads") from None

    @classmethod
    def for_target(cls, config) -> "HeadConfig":
        """A one-layer head shaped like the target's decoder layers (what train_eagle.py trains)."""
        cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
        rope = getattr(cfg, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        return cls(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                   num_attention_heads=cfg.num_attention_heads,
                   num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
                   rms_norm_eps=getattr(cfg, "rms_norm_eps", 1e-6), rope_theta=float(theta),
                   head_dim=getattr(cfg, "head_dim", 0) or 0, vocab_size=cfg.vocab_size)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # as Llama: the statistics in float32 whatever the dtype
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in Llama's half-split layout; x (heads, rows, head_dim), cos/sin (rows, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.heads, self.kv_heads, self.dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.heads * self.dim, c.hidden_size, bias=c.attention_bias)

    def forward(self, x, cos, sin, past_k, past_v, visible):
        """x (rows, hidden); past_k/v (kv_heads, cached, head_dim); visible (rows, cached + rows) bool.
        Returns the output and this call's keys and values (for the caller to keep or drop)."""
        n = x.shape[0]
        q = rotate(self.q_proj(x).view(n, self.heads, self.dim).transpose(0, 1), cos, sin)
        k = rotate(self.k_proj(x).view(n, self.kv_heads, self.dim).transpose(0, 1), cos, sin)
        v = self.v_proj(x).view(n, self.kv_heads, self.dim).transpose(0, 1)
        keys, values = torch.cat([past_k, k], dim=1), torch.cat([past_v, v], dim=1)
        group = self.heads // self.kv_heads
        if group > 1:
            keys, values = keys.repeat_interleave(group, dim=0), values.repeat_interleave(group, dim=0)
        out = nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=visible[None])
        return self.o_proj(out.transpose(0, 1).reshape(n, self.heads * self.dim)), k, v


class MLP(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: HeadConfig, index: int):
        super().__init__()
        # EAGLE's first layer reads fc's output directly: no input norm
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps) if index > 0 else None
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, past_k, past_v, visible):
        h = x if self.input_layernorm is None else self.input_layernorm(x)
        h, k, v = self.self_attn(h, cos, sin, past_k, past_v, visible)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class HeadCache:
    """The head's keys and values, per layer (kv_heads, length, head_dim), of the positions it has
    read for good (decided tokens); a draft's rows are attended to but never stored here."""

    def __init__(self, head: "EagleHead"):
        c = head.config
        p = head.fc.weight
        empty = p.new_zeros(c.num_key_value_heads, 0, c.head_dim)
        self.keys = [empty] * c.num_hidden_layers
        self.values = [empty] * c.num_hidden_layers

    @property
    def length(self) -> int:
        return self.keys[0].shape[1]

    def append(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.keys = [torch.cat([a, b], dim=1) for a, b in zip(self.keys, keys)]
        self.values = [torch.cat([a, b], dim=1) for a, b in zip(self.values, values)]


class EagleHead(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        if config.num_hidden_layers < 1:
            raise EagleHeadError("an EAGLE head needs at least one decoder layer")
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.bias)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        d = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        angles = positions.to(self.inv_freq.device, torch.float32)[:, None] * self.inv_freq[None]
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                visible: torch.Tensor, past: HeadCache | None = None, extra: list | None = None):
        """features, embeds (rows, hidden): f_t and embed(x_{t+1}) for each row; positions (rows,) the
        rows' t; visible (rows, cached + extra + rows) bool: what each row attends to among the cache,
        `extra` (per layer (keys, values) of earlier draft rows) and the rows themselves.
        Returns (predicted features (rows, hidden), per layer (keys, values) of these rows)."""
        x = self.fc(torch.cat([embeds, features], dim=-1))
        cos, sin = self.rope(positions, x.dtype)
        new = []
        for i, layer in enumerate(self.layers):
            pk = past.keys[i] if past is not None else x.new_zeros(layer.self_attn.kv_heads, 0, layer.self_attn.dim)
            pv = past.values[i] if past is not None else pk
            if extra:
                pk, pv = torch.cat([pk, extra[i][0]], dim=1), torch.cat([pv, extra[i][1]], dim=1)
            x, k, v = layer(x, cos, sin, pk, pv, visible)
            new.append((k, v))
        return x, new

    # ---- checkpoint layout ----

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.state_dict().items()}


def check_head_dir(directory: str | Path) -> HeadConfig:
    """A head directory's config and weights file, without reading the weights."""
    directory = Path(directory)
    cfg = HeadConfig.from_dict(CHECKPOINT.read_config(directory, "hidden_size"))
    CHECKPOINT.weights_file(directory)
    return cfg


def load_head(directory: str | Path, embedding: torch.Tensor | None = None) -> EagleHead:
    """Read a head in the published layout, on the CPU in float32. `embedding`: the target's input
    embedding, against which a checkpoint's own copy (`embed_tokens.weight`) is checked."""
    directory = Path(directory)
    config = check_head_dir(directory)
    state = {k.removeprefix("model.").removeprefix("ea_layer."): v for k, v in CHECKPOINT.read_weights(directory).items()}
    copy = state.pop("embed_tokens.weight", None)
    if copy is not None and embedding is not None and tuple(copy.shape) != tuple(embedding.shape):
        raise EagleHeadError(f"the EAGLE head in {directory} was trained with an embedding of shape "
                             f"{tuple(copy.shape)}, the target's is {tuple(embedding.shape)}: a head for "
                             f"another model")
    head = EagleHead(config)
    mine = head.state_dict()
    missing = sorted(set(mine) - set(state))
    unknown = sorted(set(state) - set(mine))
    if missing or unknown:
        raise EagleHeadError(f"EAGLE head in {directory}: " + "; ".join(
            part for part in (f"missing {', '.join(missing[:3])}" if missing else "",
                              f"unexpected {', '.join(unknown[:3])}" if unknown else "") if part)
            + " (expected EAGLE's layout: fc.weight, layers.0.self_attn.q_proj.weight, ...)")
    for k, dst in mine.items():
        if tuple(state[k].shape) != tuple(dst.shape):
            raise EagleHeadError(f"EAGLE head in {directory}: '{k}' has shape {tuple(state[k].shape)}, the "
                                 f"config implies {tuple(dst.shape)}")
    head.load_state_dict({k: v.float() for k, v in state.items()})
    return head.eval()


def save_head(head: EagleHead, directory: str | Path, dtype: torch.dtype = torch.float16, **config_extra) -> Path:
    """config.json (LlamaConfig-style, num_hidden_layers = the head's) + model.safetensors."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    c = head.config
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           **dataclasses.asdict(c), **config_extra}
    (directory / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: v.to(dtype).contiguous().cpu() for k, v in head.published_state_dict().items()},
              str(directory / WEIGHT_FILES[0]))
    return directory


def resolve_head_dir(head: str | os.PathLike | None, model_name: str | None, download: bool = True) -> Path | None:
    """`default` (the head for this model), a local directory, or a hub id (fetched; None for one
    when not `download`)."""
    return CHECKPOINT.resolve(head, model_name, download)

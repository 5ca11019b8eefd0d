"""Named model shapes with random weights: a GPU's cost curve at a real model's shape, no checkpoint.

A forward's time depends on the model's shape (layers, widths, heads, vocabulary), the device and the
dtype, not on the weights' values; so a LlamaForCausalLM of Vicuna-7B's shape with random weights,
built directly on the GPU, times what Vicuna-7B's forward costs there, with no network and no download.

Real shapes are the published configs (no weights): `smollm2-135m` (SmolLM2-135M), `vicuna-7b` and
`vicuna-13b` (Vicuna v1.3 = LLaMA-7B / LLaMA-13B: full multi-head attention, untied lm_head, 32000
tokens). Each has a tiny stand-in of the same family (`STAND_INS`), scaled down so that a CPU builds
and profiles it in seconds: a rehearsal of the GPU command, not a prediction of anything.

`measure_shape_curve` times such a model with `cost.measure_cost_curve` (eager, or the compiled
engine), roofline included; the curve names the shape and says its weights are random.
"""

from __future__ import annotations

import torch

from specbench.errors import SettingsError

# LlamaConfig keyword arguments of each shape. Vicuna v1.3 as LLaMA-1 ships it: rms_norm_eps 1e-6,
# 2048 positions, rope theta 10000; SmolLM2-135M: grouped-query attention (3 kv heads), tied head.
_LLAMA_1 = dict(hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=2048, rope_theta=10000.0,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, initializer_range=0.02)
_SMOLLM2 = dict(hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=8192, rope_theta=100000.0,
                tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, initializer_range=0.02)

REAL_SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(_SMOLLM2, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152),
    "vicuna-7b": dict(_LLAMA_1, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    "vicuna-13b": dict(_LLAMA_1, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                       num_attention_heads=40, num_key_value_heads=40, vocab_size=32000),
}

# Tiny stand-ins: the family, head size, kind of attention (grouped or full) and about the MLP ratio of
# their real shape, its vocabulary (the lm_head is a real share of a small model's forward), a few layers.
TINY_SHAPES: dict[str, dict] = {
    "tiny-135m": dict(_SMOLLM2, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=3, num_key_value_heads=1, vocab_size=49152),
    "tiny-7b": dict(_LLAMA_1, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                    num_attention_heads=2, num_key_value_heads=2, vocab_size=32000),
    "tiny-13b": dict(_LLAMA_1, hidden_size=384, intermediate_size=1024, num_hidden_layers=4,
                     num_attention_heads=3, num_key_value_heads=3, vocab_size=32000),
    # SmolLM2's depth (30 layers, so 30 cache layers, 30 sets of per-layer kernels) at a tiny width and
    # vocabulary: the forward is nearly free, so a step's host work shows (scripts/bench_step.py)
    "tiny-depth-135m": dict(_SMOLLM2, hidden_size=64, intermediate_size=128, num_hidden_layers=30,
                            num_attention_heads=2, num_key_value_heads=1, vocab_size=1024),
}

SHAPES: dict[str, dict] = REAL_SHAPES | TINY_SHAPES

# The tiny shape that rehearses each real shape's GPU command on a CPU.
STAND_INS: dict[str, str] = {"smollm2-135m": "tiny-135m", "vicuna-7b": "tiny-7b", "vicuna-13b": "tiny-13b"}


def check_shape_name(name: str) -> str:
    """`name` if it is a shape; else a SettingsError listing the valid ones."""
    if name not in SHAPES:
        raise SettingsError(f"unknown shape '{name}'; valid shapes: {', '.join(SHAPES)}")
    return name


def real_shape(name: str) -> str:
    """The real shape `name` stands for: itself for a real shape, the rehearsed one for a tiny shape."""
    check_shape_name(name)
    return next((real for real, tiny in STAND_INS.items() if tiny == name), name)


def shape_config(name: str):
    """The shape's LlamaConfig (no weights, nothing downloaded)."""
    from transformers import LlamaConfig

    return LlamaConfig(**SHAPES[check_shape_name(name)])


def parameter_count(name: str) -> int:
    """Parameters of the shape, counted from its config: embeddings, per layer the attention
    projections, the gated MLP and two norms, the final norm and an untied lm_head."""
    c = SHAPES[check_shape_name(name)]
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim  # q, o; k, v
    mlp = 3 * h * c["intermediate_size"]  # gate, up, down
    layer = attention + mlp + 2 * h
    embeddings = c["vocab_size"] * h * (1 if c["tie_word_embeddings"] else 2)
    return embeddings + c["num_hidden_layers"] * layer + h


@torch.no_grad()
def random_model(name: str, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
    """A LlamaForCausalLM of the shape, built directly on `device` in `dtype` (no host copy in float32
    first), with transformers' own initialisation (normal(0, 0.02) weights, unit norms), eval mode,
    no gradients. Refused when a weight is not finite."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(shape_config(name), dtype=dtype)
    model.eval().requires_grad_(False)
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        raise RuntimeError(f"random_model('{name}'): a weight is not finite in {dtype}")
    return model


def curve_label(name: str) -> str:
    """The `model` field of a random-weight curve: says the weights were random."""
    return f"{name} (random weights)"


# Widths of a sparse curve: the small drafts, TR's tree (81 rows) and beyond, in 12 forwards.
SPARSE_WIDTHS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 81, 96, 128)


def measure_shape_curve(model, name: str, widths=SPARSE_WIDTHS, context_len: int = 400, repeats: int = 7,
                        warmup: int = 2, compiled: bool = False, progress: bool = False):
    """The cost curve of a random-weight model of shape `name` (from `random_model`), roofline included.
    `compiled`: time the compiled engine; where it falls back to eager the curve says `eager`
    (its `forward` field), so a caller compares that with what it asked for."""
    from specbench.decoding.engine import Engine
    from specbench.speculation.cost import measure_cost_curve

    engine = Engine(model, [], compiled=compiled)
    return measure_cost_curve(model, widths, context_len=context_len, repeats=repeats, warmup=warmup,
                              model_name=curve_label(name), dtype_name=str(model.dtype).replace("torch.", ""),
                              progress=progress, machine=True, engine=engine)

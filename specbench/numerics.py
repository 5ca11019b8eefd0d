"""Non-finite numbers stop the run: a model that computes NaN or inf is not benchmarked.

Gemma-3-270M's residual stream reaches |h| ~ 1e5 in float32, past float16's largest value (65,504):
in float16 it turns inf in a middle layer and every logit is NaN, so greedy decoding emits token 0
everywhere, AR and every method alike, and a speedup on that garbage would look real. The engine
tests the prefill's logits once per turn (one small host read), the lossless check its forward's;
on a non-finite value `check_finite` finds, on the same prompt with forward hooks over the decoder
layers (only then: it costs one more forward), the first layer whose hidden state overflowed, and
raises one `NonFiniteError` line naming the model, the dtype, that layer and the fix.
"""

from __future__ import annotations

import torch

from specbench.errors import SpecbenchError


class NonFiniteError(SpecbenchError, FloatingPointError):
    """The model's logits hold NaN or inf: its numbers overflowed the dtype it runs in."""


def all_finite(t: torch.Tensor) -> bool:
    """One host read: whether every value of `t` is finite."""
    return bool(torch.isfinite(t).all())


def check_finite(model, logits: torch.Tensor, input_ids=None, where: str = "the prefill") -> None:
    """NonFiniteError unless every logit is finite. `input_ids` (the prompt the logits came from, a
    list or tensor): where given, the first decoder layer that overflowed is found and named."""
    if all_finite(logits):
        return
    raise NonFiniteError(non_finite_message(model, input_ids, where))


def model_label(model) -> str:
    """The model's name for a message: its checkpoint's folder name, else its architecture."""
    cfg = getattr(model, "config", None)
    name = str(getattr(cfg, "_name_or_path", "") or "").rstrip("/")
    parts = [p for p in name.split("/") if p]
    # an embedded model's conversion sits in converted/<name>/<hash of its GGUF>
    if len(parts) >= 3 and parts[-3] == "converted":
        name = parts[-2]
    elif parts:
        name = parts[-1]
    kind = getattr(cfg, "model_type", None)
    return f"{name} ({kind})" if name and kind else (name or kind or type(model).__name__)


def decoder_layers(model):
    """The model's decoder layers (an nn.ModuleList), or None where they cannot be found."""
    for path in ("model.layers", "model.language_model.layers", "transformer.h", "model.decoder.layers",
                 "gpt_neox.layers", "language_model.model.layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, torch.nn.ModuleList) and len(obj):
            return path, obj
    return None, None


@torch.inference_mode()
def first_overflowing_layer(model, input_ids) -> tuple[str, float] | None:
    """(the name of the first decoder layer whose output holds a non-finite value, the largest finite
    |h| the layer before it produced) on one forward over `input_ids`; None when none is found."""
    path, layers = decoder_layers(model)
    if layers is None:
        return None
    seen: list = []
    largest = [0.0]

    def hook(index):
        def record(module, args, output):
            if seen:
                return
            h = output[0] if isinstance(output, (tuple, list)) else output
            if not isinstance(h, torch.Tensor):
                return
            if not all_finite(h):
                seen.append(index)
            else:
                largest[0] = float(h.detach().abs().max())
        return record

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1).to(model.device)
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
    except Exception:  # a diagnosis, never a second failure
        return None
    finally:
        for h in handles:
            h.remove()
    if not seen:
        return None
    return f"{path}.{seen[0]} (decoder layer {seen[0] + 1} of {len(layers)})", largest[0]


def non_finite_message(model, input_ids=None, where: str = "the prefill") -> str:
    dtype = str(getattr(model, "dtype", "")).removeprefix("torch.")
    layer = first_overflowing_layer(model, input_ids) if input_ids is not None else None
    limit = torch.finfo(model.dtype).max if getattr(model, "dtype", None) in (torch.float16, torch.bfloat16) \
        else None
    if layer is not None:
        name, before = layer
        cause = f"its hidden state first overflows at {name}"
        if before and limit:
            size = f"{before:,.0f}" if before >= 100 else f"{before:.3g}"
            cause += f" (|h| reached {size} in the layer before; {dtype}'s largest value is {limit:,.0f})"
    else:
        cause = f"a value exceeded {dtype}'s range" + (f" ({limit:,.0f})" if limit else "")
    fix = ("run it in dtype=bfloat16 (float32's range) or dtype=float32" if dtype == "float16"
           else "run it in dtype=float32" if dtype == "bfloat16"
           else "check the model's weights (they compute NaN or inf even in float32)")
    return f"model {model_label(model)} computes NaN/inf logits in {dtype} ({where}): {cause}; {fix}"

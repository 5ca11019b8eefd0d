"""Keep only the accepted path's rows in the KV cache after a tree forward."""

from __future__ import annotations

import functools
import inspect

import torch

from specbench.decoding.transfers import to_device


def with_cache(model, cache) -> dict:
    """`{keyword: cache}` for the model's forward: transformers 5.24 renamed `past_key_values` to
    `cache` (the old name warns, and is removed in 5.40); older 5.x releases know only the old one."""
    return {cache_keyword(model): cache}


def cache_keyword(model) -> str:
    return _cache_keyword(type(model))


@functools.cache
def _cache_keyword(model_type: type) -> str:
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


@torch.inference_mode()  # the cache's tensors come from inference-mode forwards; written in place
def compact_kv_cache(cache, cache_len: int, keep: list[int], keep_on_device: torch.Tensor | None = None) -> None:
    """Shrink every layer to the prefix plus the new rows `keep` (offsets from cache_len), in order.

    When the kept rows are already the first ones (a chain, or nothing accepted) this is a crop;
    otherwise the kept rows are gathered into place first. `keep` must be ascending (a tree path).
    `keep_on_device`: the same offsets already on the cache's device (the engine's accepted path),
    so that gathering needs no copy from the host.
    """
    m = len(keep)
    contiguous = keep == list(range(m))
    if cache.layers and hasattr(cache.layers[0], "cumulative_length"):
        return _compact_static(cache, cache_len, keep, contiguous, keep_on_device)
    index_on: dict = {}  # the gather index on each device the layers live on, made once
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        if contiguous:
            layer.keys = layer.keys[..., : cache_len + m, :]
            layer.values = layer.values[..., : cache_len + m, :]
        else:
            dev = layer.keys.device
            if dev not in index_on:
                index_on[dev] = _gather_index(keep, keep_on_device, cache_len, dev)
            idx = index_on[dev]
            # Move the kept rows down in place (keep is ascending, so each row moves to a slot at or
            # before its own) and crop: the prefix is not copied. The layer owns its tensors (every
            # cache update concatenates into a new one), so writing into them is safe.
            layer.keys[..., cache_len : cache_len + m, :] = layer.keys.index_select(-2, idx)
            layer.values[..., cache_len : cache_len + m, :] = layer.values.index_select(-2, idx)
            layer.keys = layer.keys[..., : cache_len + m, :]
            layer.values = layer.values[..., : cache_len + m, :]


def _gather_index(keep: list[int], keep_on_device: torch.Tensor | None, cache_len: int, device) -> torch.Tensor:
    """Absolute rows to keep, on `device`: from the device's own copy when there is one."""
    if keep_on_device is not None and keep_on_device.device == torch.device(device):
        return keep_on_device + cache_len
    return to_device(keep, device, torch.long) + cache_len


def _compact_static(cache, cache_len: int, keep: list[int], contiguous: bool,
                    keep_on_device: torch.Tensor | None) -> None:
    """Static layers (the compiled forward): fixed buffers, written at `cumulative_length`. Move the kept
    rows down in place and set the length; stale rows past it stay, hidden by the mask until overwritten.
    Everything in place, so buffer addresses (which CUDA graphs replay on) never change."""
    m = len(keep)
    stacked = getattr(cache.layers[0], "stacked", None)
    if stacked is not None and all(getattr(layer, "stacked", None) is stacked for layer in cache.layers):
        if not contiguous:  # every layer at once (compiled.StackedBuffers), dim 3 = rows
            src = _gather_index(keep, keep_on_device, cache_len, stacked.keys.device)
            dst = torch.arange(cache_len, cache_len + m, device=stacked.keys.device)
            for buf in (stacked.keys, stacked.values):
                buf.index_copy_(3, dst, buf.index_select(3, src))
        stacked.lengths.fill_(cache_len + m)
        return
    dst = src = None
    for layer in cache.layers:
        if not contiguous:
            if src is None:
                src = _gather_index(keep, keep_on_device, cache_len, layer.keys.device)
                dst = torch.arange(cache_len, cache_len + m, device=layer.keys.device)
            # index_select copies first, so overlapping source and destination rows are safe
            layer.keys.index_copy_(2, dst, layer.keys.index_select(2, src))
            layer.values.index_copy_(2, dst, layer.values.index_select(2, src))
        layer.cumulative_length.fill_(cache_len + m)

"""Attention masks for a draft tree's verification rows over a KV cache."""

from __future__ import annotations

import torch


def tree_attention_mask(
    visibility: torch.Tensor,
    depths: torch.Tensor,
    cache_len: int,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Additive 4-D mask (1, 1, rows, cache_len + rows): 0 where a row may look, dtype-min elsewhere.

    `visibility` (rows x rows, bool) says which new rows each new row sees (for a tree: ancestors
    and itself); every row also sees the whole cached prefix. With `sliding_window`, a row at
    position p = cache_len + depth loses prefix positions j <= p - window, exactly what a
    sliding-window layer saw in sequential decoding (the KV cache holds one row per position).
    Built on `device` (default: the visibility's), so the engine never copies a mask per step.
    """
    dev = torch.device(device) if device is not None else visibility.device
    rows = visibility.shape[0]
    allowed = torch.ones(rows, cache_len + rows, dtype=torch.bool, device=dev)
    allowed[:, cache_len:] = visibility.to(dev)
    if sliding_window is not None and cache_len > 0:
        pos = cache_len + depths.to(dev)
        cols = torch.arange(cache_len, device=dev)
        allowed[:, :cache_len] &= cols[None, :] > (pos[:, None] - sliding_window)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=dev)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]

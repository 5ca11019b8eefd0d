"""Keep only the accepted path's rows in the KV cache after a tree forward."""

from __future__ import annotations

import torch


def compact_kv_cache(cache, cache_len: int, keep: list[int]) -> None:
    """Shrink every layer to the prefix plus the new rows `keep` (offsets from cache_len), in order.

    When the kept rows are already the first ones (a chain, or nothing accepted) this is a crop.
    """
    m = len(keep)
    contiguous = keep == list(range(m))
    if not contiguous:
        src = torch.tensor(keep, dtype=torch.long)
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        if contiguous:
            layer.keys = layer.keys[..., : cache_len + m, :]
            layer.values = layer.values[..., : cache_len + m, :]
        else:
            idx = (src + cache_len).to(layer.keys.device)
            layer.keys = torch.cat([layer.keys[..., :cache_len, :], layer.keys.index_select(-2, idx)], dim=-2)
            layer.values = torch.cat(
                [layer.values[..., :cache_len, :], layer.values.index_select(-2, idx)], dim=-2
            )

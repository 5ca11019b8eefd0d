"""Memory a turn holds at its end: the KV cache's bytes, the drafter's state bytes and, on CUDA, the
device's peak allocation during the turn. Measured outside the clock (after the turn's wall time)."""

from __future__ import annotations

import mmap
import sys
import types

import numpy as np
import torch

# Objects whose attributes are no state of the object holding them: code, classes, devices.
OPAQUE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
          types.BuiltinMethodType, torch.device, torch.dtype)


def target_parts(model) -> tuple[set[int], set[tuple]]:
    """(ids of the target's modules, its weights' storages): what a drafter shares with the target (EAGLE's
    embedding and head, SpS's cut-short target) and does not hold itself."""
    if model is None:
        return set(), set()
    modules = {id(m) for m in model.modules()}
    storages = {storage_key(t) for t in (*model.parameters(), *model.buffers())}
    return modules, storages


def storage_key(t: torch.Tensor) -> tuple:
    """(device, address, bytes) of the memory a tensor views; a tensor without one (sparse) by itself."""
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return (str(t.device), id(t), t.nbytes)
    return (str(t.device), s.data_ptr(), s.nbytes())


def _numpy_root(a: np.ndarray) -> np.ndarray | None:
    """The array that owns a view's memory; None for a memory-mapped file, which the OS pages in and
    out and no process holds."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    buffer = a.base.obj if isinstance(a.base, memoryview) else a.base
    return None if isinstance(a, np.memmap) or isinstance(buffer, mmap.mmap) else a


def state_bytes(obj, python_objects: bool = True, skip: tuple[set[int], set[tuple]] | None = None) -> int:
    """Bytes `obj` holds, walking its attributes, dicts, lists, tuples and sets (each object once):
    torch tensors by their storage (a cropped view counts its whole allocation, a storage shared by
    views counts once) and numpy arrays by the array that owns the memory (memory-mapped files are
    left out); with `python_objects`, plus `sys.getsizeof` of every other object reached.

    That last part is an estimate for Python-object state such as suffix trees and n-gram pools:
    getsizeof counts an object's own header and slots, not allocator overhead, and state kept in a C
    extension (a compiled suffix-tree backend) shows only as its Python wrapper. `skip`: (module ids,
    storage keys) of `target_parts`, left out."""
    skip_ids, skip_storages = skip or (set(), set())
    seen_ids, seen_storages, seen_arrays = set(skip_ids), set(skip_storages), set()
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen_ids:
            continue
        seen_ids.add(id(o))
        if isinstance(o, torch.Tensor):
            key = storage_key(o)
            if key not in seen_storages:
                seen_storages.add(key)
                total += key[2]
            continue
        if isinstance(o, np.ndarray):
            root = _numpy_root(o)
            if root is not None and id(root) not in seen_arrays:
                seen_arrays.add(id(root))
                total += root.nbytes
            continue
        if isinstance(o, OPAQUE):
            continue
        if python_objects:
            total += sys.getsizeof(o, 0)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        else:
            stack.extend(_attributes(o))
    return total


def _attributes(o) -> list:
    """An object's instance attributes: its __dict__ and the __slots__ of its classes."""
    attrs = getattr(o, "__dict__", None)
    out = list(attrs.values()) if isinstance(attrs, dict) else []
    for cls in type(o).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(o, name):
                out.append(getattr(o, name))
    return out


def kv_cache_bytes(cache) -> int:
    """The bytes of a KV cache's tensors (DynamicCache or the compiled forward's static cache): their
    storages, each once, so a static cache counts the capacity it reserved."""
    return state_bytes(cache, python_objects=False)


def start_turn(device) -> None:
    """On CUDA, the peak allocation restarts here, so the turn's own peak can be read at its end."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_device_bytes(device) -> int | None:
    """The device's peak allocation since start_turn (weights, cache and activations); None off CUDA."""
    return torch.cuda.max_memory_allocated(device) if torch.device(device).type == "cuda" else None


def turn_memory(kv_bytes: int | None, drafter, device, skip: tuple[set[int], set[tuple]]) -> dict:
    """The memory figures an answer turn records: kv_cache_bytes, drafter_state_bytes and, on CUDA,
    peak_device_bytes."""
    out = {"kv_cache_bytes": kv_bytes, "drafter_state_bytes": state_bytes(drafter, skip=skip)}
    peak = peak_device_bytes(device)
    if peak is not None:
        out["peak_device_bytes"] = peak
    return out

"""Keep the host memory a process frees, so that reusing it does not page-fault (glibc's malloc).

By default glibc hands a freed block of more than 128 KB (up to 32 MB, adjusted as it goes) back to the
kernel, and trims the top of its heap; the next block of that size is mapped afresh, and every page of
it faults and is zeroed on first touch. A CPU forward allocates its activations, logits and the grown
KV cache anew each step, so a step whose shape outgrows what the heap holds pays for faulting the
difference in: decoding one row at a time settles after a few steps, but a tree step of new width
(more rows, more logits) pays again, in page faults that can cost as much as the forward's work.
That is a cost of the allocator, not of speculation, and it falls on every method that varies its
rows; tcmalloc and jemalloc, which PyTorch's CPU tuning guide recommends, keep freed memory for reuse.
`keep_freed_memory` asks glibc to do the same: blocks come from the heap rather than mappings of
their own, and the heap is never trimmed, so the process keeps its peak and reuses it (blocks that
torch aligns, posix_memalign's, can take a few rounds to settle). GPU memory is the CUDA caching
allocator's business; this is about the host.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

HOST_MEMORY = ("keep", "system")  # keep: freed memory stays for reuse | system: the C library's defaults

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
_LARGEST = 2**31 - 1  # mallopt takes an int

_kept = False


def keep_freed_memory() -> str | None:
    """Make glibc keep freed memory for reuse (idempotent). None on success, else why not (not Linux,
    no glibc, a refused setting): the run goes on with the C library's defaults."""
    global _kept
    if _kept:
        return None
    if not sys.platform.startswith("linux"):
        return f"host_memory=keep needs glibc's malloc; {sys.platform} keeps its own defaults"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as e:  # musl and others have no mallopt
        return f"host_memory=keep: no glibc mallopt here ({e})"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # Both: setting either fixes glibc's mapping threshold where it stands (128 KB at first), which
    # alone would map, and fault in, every large block afresh
    for param, value in ((M_MMAP_THRESHOLD, _LARGEST), (M_TRIM_THRESHOLD, _LARGEST)):
        if mallopt(param, value) != 1:
            return f"host_memory=keep: glibc refused mallopt({param}, {value})"
    _kept = True
    return None


def apply_host_memory(setting: str) -> str:
    """Apply the `host_memory` setting; what is in effect (results record it), with one warning line
    on stderr when `keep` cannot be had here."""
    if setting == "keep":
        problem = keep_freed_memory()
        if problem is None:
            return "keep"
        print(f"warning: {problem}; continuing with the system allocator's defaults", file=sys.stderr)
    return "keep" if _kept else "system"  # once kept, a process keeps it

"""host_memory=keep: freed host memory is reused without faulting its pages in again."""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.run.host_memory import apply_host_memory, keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


def grow_and_free(blocks: int = 8, size: int = 16 << 20) -> int:
    """Page faults while `blocks` blocks are malloc'd, written and freed (what a step's tensors do)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks_ = [libc.malloc(size) for _ in range(blocks)]
    for b in blocks_:
        libc.memset(b, 1, size)
    for b in blocks_:
        libc.free(b)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@linux_only
def test_freed_blocks_are_reused_without_page_faults():
    assert keep_freed_memory() is None
    assert keep_freed_memory() is None  # idempotent
    pages = 8 * (16 << 20) // resource.getpagesize()
    grow_and_free()  # the first time grows the heap
    assert grow_and_free() < pages // 20  # glibc's defaults map and unmap each block: every page faults again


@linux_only
def test_by_default_glibc_hands_such_blocks_back():  # what the test above would see without the setting
    code = ("import sys; sys.path.insert(0, %r); from tests.test_host_memory import grow_and_free; "
            "grow_and_free(); print(grow_and_free())" % str(ROOT))
    # glibc's own defaults: no MALLOC_* tunables, no preloaded allocator from the calling environment
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))}
    faults = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                env=env).stdout)
    assert faults > 8 * (16 << 20) // resource.getpagesize() // 2


@linux_only
def test_the_setting_reports_what_is_in_effect():
    assert apply_host_memory("keep") == "keep"
    assert apply_host_memory("system") == "keep"  # a process that kept its memory keeps it

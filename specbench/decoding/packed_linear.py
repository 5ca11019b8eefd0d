"""Linear layers for the compiled CPU forward: weights packed once for our own kernel
(`packed_linear.cpp`), which reads every weight once per step, however many rows the step has.

The kernel overlaps the weight reads with the arithmetic, and computes each output as one FMA chain
in order, so a verification row equals a one-row step bit for bit in these products. It is built on
first use by `torch.utils.cpp_extension` and cached by torch (`TORCH_EXTENSIONS_DIR`); it needs
x86-64 with AVX2 and FMA. `available()` and `build_problem()` say whether it runs and builds here;
where not, the compiled forward uses inductor's products (decoding/forward_choice.py): the kernel is
a speed-up, never a requirement. Why it was written: docs/compiled-forward.md. The same extension
carries our other CPU kernels, Token Recycling's: `row_summary.cpp` (the top k and normaliser of each
verified row, drafting/row_summary.py), `tree_expansion.cpp` (its template expanded from the matrix,
drafting/recycling.py) and `goodput_choice.cpp` (the goodput chooser's estimates and sub-tree, methods/tr/adaptive.py),
the sampler's `keyed_sampling.cpp` (a sampled row's token without drawing its noise, decoding/sampling.py)
and Prompt Lookup's `ngram_search.cpp` (drafting/ngram.py, for `pld` and `tr_fused`), so a machine builds one
extension, once. Those host kernels are torch ops (`torch.ops.specbench.*`) and also, through
`host_bindings.cpp`, functions of the extension's own Python module (`host_kernels()`), which the drafters
and the sampler call every step: the same C++ without torch's dispatcher in front.
"""

from __future__ import annotations

import copy
import functools
import itertools
import os
import platform
import re
import time

import torch
from torch import nn

PANEL = 6  # output columns per panel, as in packed_linear.cpp
SOURCE = os.path.join(os.path.dirname(__file__), "packed_linear.cpp")
SOURCES = [SOURCE, *(os.path.join(os.path.dirname(__file__), f) for f in ("row_summary.cpp", "tree_expansion.cpp",
                                                                             "goodput_choice.cpp", "keyed_sampling.cpp",
                                                                             "ngram_search.cpp", "host_bindings.cpp"))]


def available() -> bool:
    """Whether the kernel runs here: an x86-64 CPU with AVX2 (AVX-512 machines have it too)."""
    return platform.machine().lower() in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in (
        "AVX2", "AVX512")


# Extra compiler flags for the kernel, for a user's toolchain (and for the test that makes the build fail
# on purpose: -DSPECBENCH_BREAK_BUILD)
EXTRA_CFLAGS_ENV = "SPECBENCH_KERNEL_CFLAGS"
NAME = "specbench_cpu_kernels"
STALE_BATON_SECONDS = 600  # a build takes seconds to a minute; a lock this old was left by a killed one


_said: list[bool] = [False]  # whether this process was told why the kernel does not run (one line per run)


def problem_said() -> bool:
    """Whether a line has told this process that the kernel (or the compiler it needs) does not run."""
    return _said[0]


def note_problem_said() -> None:
    """A line saying why the kernel does not run was printed (the forward's choice, or TR's row summary):
    its other users fall back without a line of their own."""
    _said[0] = True


class KernelBuildError(RuntimeError):
    """The kernel did not build or load here; the message is the compiler's first error line."""


def build_problem() -> str | None:
    """None when the kernel builds and loads here, else one line saying why not."""
    if not available():
        return f"it needs an x86-64 CPU with AVX2 (this one: {platform.machine()}, " \
               f"{torch.backends.cpu.get_cpu_capability()})"
    return _build_once()


@functools.cache
def _build_once() -> str | None:
    """Build and load, once per process (a failed build is not retried): None, or the compiler's error."""
    try:
        _build()
    except Exception as e:  # a compiler, its headers, ninja, the linker: any of them may fail
        return first_error_line(str(e)) or type(e).__name__
    return None


def first_error_line(log: str) -> str:
    """What a build log says went wrong: the compiler's first `error:` message (`file:line: error: ...`,
    `#error ...`), else the log's first line."""
    for line in log.splitlines():
        m = re.search(r"(?:\berror:|#error)\s*(.+)", line)
        if m:
            return m.group(1).strip()[:200]
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return lines[0][:200] if lines else ""


def load_kernel() -> float:
    """Build (the first time on a machine, for this torch) or load the kernel and register
    `torch.ops.specbench.packed_linear`. Returns the seconds it took; raises KernelBuildError when it
    cannot (build_problem says why)."""
    t0 = time.perf_counter()
    problem = build_problem()
    if problem:
        raise KernelBuildError(f"the packed kernel is unavailable: {problem}")
    return time.perf_counter() - t0


_module: list = [None]  # the extension's Python module once built and loaded (host_bindings.cpp)


def host_kernels():
    """The host kernels' direct bindings (row_summary, write_rows, expand_*, choose_nodes, ...: the same
    functions as `torch.ops.specbench.*`), or None where the extension does not build here. The first
    call builds it."""
    if _module[0] is None and available():
        build_problem()
    return _module[0]


def clear_stale_baton(build_dir: str, stale_after: float = STALE_BATON_SECONDS) -> bool:
    """Remove the build lock a killed build left behind (torch's FileBaton waits for it forever, so every
    later run would hang before its first forward); a younger lock is another process building now.
    Returns whether one was removed."""
    baton = os.path.join(build_dir, "lock")
    try:
        if time.time() - os.path.getmtime(baton) < stale_after:
            return False
        os.remove(baton)
    except OSError:  # no lock, or another process removed it first
        return False
    print(f"note: removed a stale build lock of our CPU kernels ({baton}), left by an interrupted build")
    return True


def _build() -> None:
    from torch.utils import cpp_extension
    from torch.utils.cpp_extension import load

    try:  # where torch builds it (a private helper: if it moves, the lock is simply not checked)
        clear_stale_baton(cpp_extension._get_build_directory(NAME, False))
    except Exception:
        pass
    extra = os.environ.get(EXTRA_CFLAGS_ENV, "").split()
    _module[0] = load(name=NAME, sources=SOURCES, is_python_module=True,
                      extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp", *extra], extra_ldflags=["-fopenmp"])

    @torch.library.register_fake("specbench::packed_linear")
    def _shape(x, w, n, bias):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("specbench::row_summary")
    def _summary_shape(logits, k, normaliser):
        rows = logits.shape[0]
        return (logits.new_empty((rows, k)), logits.new_empty((rows, k), dtype=torch.long),
                logits.new_empty((rows if normaliser else 0,)))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """W [n, K] -> panels [ceil(n / 6), K, 6]: w[p, k, j] = W[6p + j, k], zero rows past n."""
    n, k = weight.shape
    panels = -(-n // PANEL)
    padded = torch.zeros((panels * PANEL, k), dtype=weight.dtype, device=weight.device)
    padded[:n] = weight.detach()
    return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()


class PackedLinear(nn.Module):
    """`nn.Linear` with its weight packed for `specbench::packed_linear` (float32 only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        load_kernel()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", pack_weight(linear.weight), persistent=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.specbench.packed_linear(x, self.packed, self.out_features, self.bias)


def with_packed_linears(model: nn.Module) -> nn.Module:
    """A twin of `model` whose float32 `nn.Linear`s are `PackedLinear`s; every other weight is shared,
    not copied, and `model` itself is left as it is (its eager users, `generate` among them, keep
    their products)."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    twin = copy.deepcopy(model, shared)
    for name, module in list(twin.named_modules()):
        if isinstance(module, nn.Linear) and module.weight.dtype == torch.float32:
            parent, _, leaf = name.rpartition(".")
            setattr(twin.get_submodule(parent), leaf, PackedLinear(module))
    return twin

"""Linear layers for the compiled CPU forward: weights packed once for our own kernel
(`packed_linear.cpp`), which reads every weight once per step, however many rows the step has.

A verification step multiplies up to a few dozen rows by every weight of the model. Inductor's C++ GEMM
template (and oneDNN) fetch a block of weights and then compute on it, so on this CPU a 16-row step cost
the weight read *plus* the arithmetic (results/cpu-compiled/kernels.md). The kernel overlaps the two.
It also makes each row's result independent of the rows beside it (one FMA chain per output, in
order), so a verification row equals a one-row step bit for bit in these products.

The kernel is built on first use with `torch.utils.cpp_extension` (a C++ compiler, as inductor needs
anyway) and cached on disk by torch (`TORCH_EXTENSIONS_DIR`). It needs x86-64 with AVX2 and FMA;
`available()` says whether this machine can run it, and the compiled forward falls back to inductor's
own products where it cannot.
"""

from __future__ import annotations

import copy
import functools
import itertools
import os
import platform
import time

import torch
from torch import nn

PANEL = 6  # output columns per panel, as in packed_linear.cpp
SOURCE = os.path.join(os.path.dirname(__file__), "packed_linear.cpp")


def available() -> bool:
    """Whether the kernel runs here: an x86-64 CPU with AVX2 (AVX-512 machines have it too)."""
    return platform.machine().lower() in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in (
        "AVX2", "AVX512")


@functools.cache
def load_kernel() -> float:
    """Build (first time on this machine: about 30 s) or load the kernel and register
    `torch.ops.specbench.packed_linear`. Returns the seconds it took."""
    from torch.utils.cpp_extension import load

    t0 = time.perf_counter()
    load(name="specbench_packed_linear", sources=[SOURCE], is_python_module=False,
         extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp", "-std=c++17"], extra_ldflags=["-fopenmp"])

    @torch.library.register_fake("specbench::packed_linear")
    def _shape(x, w, n, bias):
        return x.new_empty((*x.shape[:-1], n))

    return time.perf_counter() - t0


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

"""Where one verification forward's time goes, kernel by kernel, and how fast each matrix product runs.

The roofline (roofline.py) says how far a whole forward is from the hardware; this says which
kernels make up the gap: `torch.profiler`'s self time per operator and, for each matrix product of
known shape, the weight bandwidth (GB/s) and FLOP rate (GFLOP/s) it reached. Inductor's kernels are
named in the profile only when `torch._inductor.config.cpp.enable_kernel_profile` is set before
compiling (scripts/profile_kernels.py does so). Where the shapes come from: docs/cost-model.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GEMM_TEMPLATE_NAME = re.compile(r"gemm_m\w*?n(\d+)k(\d+)")
SHAPED_MATMULS = ("aten::mm", "aten::addmm")  # (input [m, k], weight [k, n]); addmm: bias first
PACKED_LINEARS = ("mkldnn::_linear_pointwise",)  # oneDNN with prepacked weights: (input [..., k], weight [n, k])
# our kernel (specbench/decoding/packed_linear.py): (input [..., k], weight panels [n / 6, k, 6], ...);
# n is the panels' padded width, which is what the kernel reads
PANEL_LINEARS = ("specbench::packed_linear",)


@dataclass(frozen=True)
class KernelTime:
    """One kernel's (or operator's) self time per forward step."""

    name: str
    ms_per_step: float
    calls_per_step: float
    gemm: tuple[int, int] | None = None  # (n, k) of a matrix product, when known

    def rates(self, rows: int, itemsize: int) -> tuple[float, float] | None:
        """(GB/s of weights read, GFLOP/s) of a matrix product over `rows` rows; None otherwise."""
        if self.gemm is None or self.ms_per_step <= 0 or self.calls_per_step <= 0:
            return None
        n, k = self.gemm
        per_call = self.ms_per_step / 1e3 / self.calls_per_step
        return n * k * itemsize / per_call / 1e9, 2 * rows * n * k / per_call / 1e9


def gemm_shape(name: str, input_shapes=None) -> tuple[int, int] | None:
    """(n, k) of a matrix product from its kernel name or its recorded input shapes; None if not one."""
    m = GEMM_TEMPLATE_NAME.search(name)
    if m:
        return int(m.group(1)), int(m.group(2))
    if name in SHAPED_MATMULS and input_shapes:
        shapes = [s for s in input_shapes if s]
        if name == "aten::addmm":
            shapes = shapes[1:]
        if len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
            return int(shapes[1][1]), int(shapes[0][1])
    if name in PANEL_LINEARS and input_shapes and len(input_shapes) >= 2:
        x, w = input_shapes[0], input_shapes[1]
        if x and len(w) == 3 and w[1] == x[-1]:
            return int(w[0]) * int(w[2]), int(w[1])
    if name in PACKED_LINEARS and input_shapes and len(input_shapes) >= 2:
        x, w = input_shapes[0], input_shapes[1]
        if x and len(w) == 2 and w[1] == x[-1]:
            return int(w[0]), int(w[1])
    return None


def kernel_times(events, steps: int, min_share: float = 0.0) -> list[KernelTime]:
    """Self time per step of each profiled operator (events: `prof.key_averages(group_by_input_shape=True)`
    or anything with `key`, `self_cpu_time_total` in microseconds, `count` and `input_shapes`), one row
    per name and matrix-product shape, slowest first; rows under `min_share` of the total are dropped."""
    merged: dict[tuple[str, tuple[int, int] | None], list[float]] = {}
    for e in events:
        if e.self_cpu_time_total <= 0:
            continue
        shape = gemm_shape(e.key, getattr(e, "input_shapes", None))
        acc = merged.setdefault((e.key, shape), [0.0, 0.0])
        acc[0] += e.self_cpu_time_total / 1e3 / steps
        acc[1] += e.count / steps
    total = sum(ms for ms, _ in merged.values())
    rows = [KernelTime(name, ms, calls, shape) for (name, shape), (ms, calls) in merged.items()
            if total and ms / total >= min_share]
    return sorted(rows, key=lambda r: -r.ms_per_step)


def total_ms(times: list[KernelTime]) -> float:
    return sum(t.ms_per_step for t in times)


def gemm_ms(times: list[KernelTime]) -> float:
    return sum(t.ms_per_step for t in times if t.gemm is not None)


def breakdown_table(by_rows: dict[int, list[KernelTime]], itemsize: int, top: int = 12) -> str:
    """A markdown table: the `top` kernels (by time at the widest step) as rows, one column per row
    count with ms per step and, for matrix products, GB/s and GFLOP/s."""
    widths = sorted(by_rows)
    order: list[tuple[str, tuple[int, int] | None]] = []
    for t in by_rows[widths[-1]]:
        if (t.name, t.gemm) not in order:
            order.append((t.name, t.gemm))
    order = order[:top]
    lines = ["| kernel | calls/step | " + " | ".join(f"w={w}: ms (GB/s, GFLOP/s)" for w in widths) + " |",
             "|---|---:|" + "---:|" * len(widths)]
    for name, shape in order:
        cells, calls = [], ""
        for w in widths:
            t = next((t for t in by_rows[w] if (t.name, t.gemm) == (name, shape)), None)
            if t is None:
                cells.append("")
                continue
            calls = f"{t.calls_per_step:g}"
            r = t.rates(w, itemsize)
            cells.append(f"{t.ms_per_step:.2f}" + (f" ({r[0]:.1f}, {r[1]:.0f})" if r else ""))
        label = name if len(name) <= 60 else name[:57] + "..."
        if shape and not GEMM_TEMPLATE_NAME.search(name):  # the template's name already says it
            label += f" ({shape[0]} x {shape[1]})"
        lines.append(f"| {label} | {calls} | " + " | ".join(cells) + " |")
    for what, fn in (("all matrix products", gemm_ms), ("everything profiled", total_ms)):
        lines.append(f"| **{what}** | | " + " | ".join(f"{fn(by_rows[w]):.2f}" for w in widths) + " |")
    return "\n".join(lines)

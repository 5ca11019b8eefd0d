"""How far the timed forward is from the hardware's limits: a roofline floor beside the cost curve.

A forward of w rows must at least read the weights once and do its multiply-adds, so
floor(w) = max(weight_bytes / bandwidth, flops(w) / matmul_throughput), and t(w) / floor(w) says how
far the measured forward is from that floor (1 = at the limit). The floor is optimistic by
construction; bandwidth and throughput are what torch reaches on this device, not datasheet
figures. What it counts and leaves out: docs/cost-model.md.

The pure functions (`flops`, `floor_time`, `Roofline.floor`, `forward_vs_floor`, `width_ratios`) are
separate from the measuring ones (`measure_bandwidth`, `measure_matmul`, `machine_figures`) and from
the ones that read a model (`forward_flops`, `weight_bytes`, `model_figures`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from specbench.timing import now

# ---- pure math -----------------------------------------------------------------------------------


def flops(linear_params: float, attn_per_key: float, w: float, context: float) -> float:
    """FLOPs of a forward of w rows after `context` cached tokens (see the module docstring)."""
    return 2.0 * linear_params * w + attn_per_key * w * (context + w)


def floor_time(weight_bytes: float, bandwidth: float, flop: float, throughput: float) -> float:
    """Seconds a forward cannot beat: max(bytes / bandwidth, flops / throughput)."""
    return max(weight_bytes / bandwidth, flop / throughput)


@dataclass
class Roofline:
    """The machine's figures (bytes/s, FLOP/s) and the model's (bytes, FLOPs per row) behind floor(w)."""

    bandwidth: float  # memory read bandwidth, bytes/s
    throughput: float  # matmul throughput in the model's dtype, FLOP/s
    weight_bytes: int  # bytes of weights one forward reads
    linear_params: int  # weights applied to every row: 2 x linear_params FLOPs per row
    attn_per_key: int  # attention FLOPs per row per attended token: 4 x layers x heads x head_dim
    matmul_size: int = 0  # n of the n x n x n matmul behind `throughput`
    dtype: str = ""  # dtype of that matmul

    def flops(self, w: float, context: float) -> float:
        return flops(self.linear_params, self.attn_per_key, w, context)

    def floor(self, w: float, context: float) -> float:
        return floor_time(self.weight_bytes, self.bandwidth, self.flops(w, context), self.throughput)

    def limit(self, w: float, context: float) -> str:
        """Which roof sets floor(w): 'memory' or 'compute'."""
        return "memory" if self.weight_bytes / self.bandwidth >= self.flops(w, context) / self.throughput \
            else "compute"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict | None) -> "Roofline | None":
        if not d:
            return None
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def forward_vs_floor(curve, mean_rows: float | None = None) -> dict | None:
    """The summary's `forward_vs_floor`: t(1), floor(1) and their ratio, and the ratio at the run's
    mean rows per step. None when the curve carries no roofline (older curve files)."""
    rl = getattr(curve, "roofline", None)
    if rl is None:
        return None
    ctx = curve.context_len
    t1, f1 = curve.t(1), rl.floor(1, ctx)
    out = {"t1_ms": round(t1 * 1e3, 3), "floor1_ms": round(f1 * 1e3, 3), "ratio_t1": t1 / f1,
           "limit_t1": rl.limit(1, ctx), "mean_rows": mean_rows, "t_mean_rows_ms": None,
           "floor_mean_rows_ms": None, "ratio_at_mean_rows": None, "limit_at_mean_rows": None,
           "bandwidth_gb_s": rl.bandwidth / 1e9, "matmul_gflop_s": rl.throughput / 1e9,
           "weight_mb": rl.weight_bytes / 1e6, "context_len": ctx}
    if mean_rows:
        t, f = curve.t(mean_rows), rl.floor(mean_rows, ctx)
        out.update(t_mean_rows_ms=round(t * 1e3, 3), floor_mean_rows_ms=round(f * 1e3, 3),
                   ratio_at_mean_rows=t / f, limit_at_mean_rows=rl.limit(mean_rows, ctx))
    return out


def width_ratios(curve, widths=(8, 16)) -> list[dict]:
    """t(w)/t(1) beside floor(w)/floor(1) for each w the curve measured: how much a w-row step costs
    over a one-row step, and how much it must cost at the least on this machine. The second depends
    on the machine's balance: where bandwidth / throughput is high, w rows are compute-bound early and
    floor(w)/floor(1) alone can exceed a target set for t(w)/t(1)."""
    rl = getattr(curve, "roofline", None)
    out = []
    for w in widths:
        if w not in curve.widths:
            continue
        r = {"w": w, "t_ratio": curve.t(w) / curve.t(1), "floor_ratio": None}
        if rl is not None:
            r["floor_ratio"] = rl.floor(w, curve.context_len) / rl.floor(1, curve.context_len)
        out.append(r)
    return out


def footer_lines(summary: dict) -> list[str]:
    """The console table's line about t(1)/floor; none when the summary has no `forward_vs_floor`."""
    f = summary.get("forward_vs_floor")
    if not f:
        return []
    line = (f"t(1)/floor = {f['ratio_t1']:.1f} (t(1) = {f['t1_ms']:.1f} ms, floor {f['floor1_ms']:.1f} ms, "
            f"{f['limit_t1']}-bound: {f['weight_mb']:.0f} MB at {f['bandwidth_gb_s']:.1f} GB/s, "
            f"{f['matmul_gflop_s']:.0f} GFLOP/s matmul)")
    if f.get("ratio_at_mean_rows") is not None:
        line += (f"; at {f['mean_rows']:.1f} rows t/floor = {f['ratio_at_mean_rows']:.1f} "
                 f"({f['limit_at_mean_rows']}-bound)")
    return [line + "; speedups are ratios of this forward's costs"]


# ---- reading a model -----------------------------------------------------------------------------


def _linear_params(model) -> int:
    """Weights of every nn.Linear (each is applied once per row; a tied lm_head counts here)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def _attn_per_key(model) -> int:
    c = model.config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return 4 * c.num_hidden_layers * heads * head_dim


def forward_flops(model, w: int, context: int) -> float:
    """FLOPs of one forward of w rows after `context` cached tokens (module docstring: what counts)."""
    return flops(_linear_params(model), _attn_per_key(model), w, context)


def weight_bytes(model) -> int:
    """Bytes of weights one forward reads: each parameter once (shared tensors once), less an
    untied input embedding (its lookup reads only the rows' embeddings)."""
    seen: dict[int, int] = {}
    for p in model.parameters():  # parameters() already yields a tied tensor once; data_ptr to be sure
        seen.setdefault(p.data_ptr(), p.numel() * p.element_size())
    total = sum(seen.values())
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    if emb is not None and (out is None or out.weight.data_ptr() != emb.weight.data_ptr()):
        total -= emb.weight.numel() * emb.weight.element_size()
    return total


def model_figures(model) -> dict:
    return {"weight_bytes": weight_bytes(model), "linear_params": _linear_params(model),
            "attn_per_key": _attn_per_key(model)}


# ---- measuring the machine -----------------------------------------------------------------------


def _best_rate(fn, work: float, device, repeats: int, min_time: float) -> float:
    """Best work/s of `fn` over `repeats` timed batches; each batch runs fn enough times to last
    `min_time` seconds (calibrated on one warm-up call), device-synchronised."""
    t0 = now(device)
    fn()  # warm-up and calibration
    once = max(now(device) - t0, 1e-6)
    iters = max(1, math.ceil(min_time / once))
    best = 0.0
    for _ in range(repeats):
        t0 = now(device)
        for _ in range(iters):
            fn()
        dt = now(device) - t0
        best = max(best, work * iters / dt)
    return best


@torch.inference_mode()
def measure_bandwidth(device="cpu", size_bytes: int = 256 << 20, repeats: int = 5,
                      min_time: float = 0.01) -> float:
    """Memory read bandwidth in bytes/s: best of `repeats` timed sums over a float32 buffer of
    `size_bytes` (default 256 MiB, far above the CPU's L3 or a GPU's L2)."""
    device = torch.device(device)
    buf = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    return _best_rate(lambda: buf.sum(), buf.numel() * 4, device, repeats, min_time)


@torch.inference_mode()
def measure_matmul(device="cpu", dtype=torch.float32, max_n: int | None = None, repeats: int = 3,
                   min_time: float = 0.05, max_time: float = 0.25) -> tuple[float, int]:
    """(FLOP/s, n) of an n x n x n matmul in `dtype`: n doubles from 256 up to `max_n` (2048 on CPU,
    8192 on GPU) while the next product would take under `max_time`, so a slow dtype (float16 on a
    CPU) stays quick; then the best of `repeats` timed batches of at least `min_time` seconds."""
    device = torch.device(device)
    max_n = max_n or (2048 if device.type == "cpu" else 8192)
    n = min(256, max_n)
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        a @ b  # first call: thread pool, kernel selection
        t0 = now(device)
        a @ b
        dt = now(device) - t0
        if n >= max_n or 8 * dt >= max_time:
            break
        n *= 2
    rate = _best_rate(lambda: a @ b, 2.0 * n ** 3, device, repeats, min_time)
    return rate, n


# Machine figures measured in this process, by (device name, dtype), as quick curves are cached.
_MACHINE: dict[tuple[str, str], dict] = {}


def machine_figures(device, dtype: torch.dtype, cache: bool = True) -> dict:
    """{'bandwidth', 'throughput', 'matmul_size', 'dtype'}, measured once per process and device/dtype
    (about a second on this CPU in float32) unless `cache` is false."""
    from specbench.timing import device_name

    key = (device_name(device), str(dtype))
    if not cache or key not in _MACHINE:
        bw = measure_bandwidth(device)
        tp, n = measure_matmul(device, dtype)
        _MACHINE[key] = {"bandwidth": bw, "throughput": tp, "matmul_size": n,
                         "dtype": str(dtype).replace("torch.", "")}
    return dict(_MACHINE[key])


def roofline_for(model, cache: bool = True) -> Roofline:
    """The model's figures and this machine's (device and dtype of the model's parameters)."""
    return Roofline(**machine_figures(model.device, model.dtype, cache), **model_figures(model))

"""The hardware's cost curve: time of one verification forward of w rows, and the speedup bound.

`measure_cost_curve` times the engine's own `forward_rows` for w rows after `context_len` cached
tokens (device-synchronised, the median per width). `scripts/profile_cost.py` measures the full
curve and caches it per (model, device name, dtype) under $SPECBENCH_CACHE/cost/; `curve_for` loads
it, or measures a quick curve that lives only in this process (only the profiler writes the cache).
A run's speedup bound, sum(accepted lengths) x t(1) / sum(t(rows of each step)), is its speedup with
zero harness overhead, prefill excluded. A curve may carry the machine's roofline (roofline.py).
Details: docs/cost-model.md.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specbench.errors import MissingFileError, SettingsError
from specbench.speculation.roofline import Roofline, roofline_for
from specbench.decoding.kv_cache import with_cache
from specbench.timing import device_name, now

QUICK_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 81)


@dataclass
class CostCurve:
    """Median forward time (seconds) of w rows, for the measured widths; t(w) interpolates."""

    widths: list[int]
    times: list[float]
    model: str = ""
    device: str = ""
    dtype: str = ""
    context_len: int = 0
    repeats: int = 0
    quick: bool = False
    created: str = ""
    versions: dict = field(default_factory=dict)
    roofline: Roofline | None = None  # the machine's limits; absent in older curve files
    forward: str = "eager"  # eager | compiled (specbench/decoding/compiled.py)
    compile_seconds: float = 0.0  # compiling before the first timed forward (compiled only)

    def __post_init__(self):
        if isinstance(self.roofline, dict):
            self.roofline = Roofline.from_json(self.roofline)
        pairs = sorted(zip((int(w) for w in self.widths), (float(t) for t in self.times)))
        if not pairs or pairs[0][0] != 1:
            raise ValueError("a cost curve needs a time for w = 1 (the plain step)")
        self.widths = [p[0] for p in pairs]
        self.times = [p[1] for p in pairs]

    def t(self, w: float) -> float:
        """Forward time of w rows: linear between measured widths, linear extrapolation past them."""
        ws, ts = self.widths, self.times
        if w <= ws[0]:
            return ts[0]
        i = bisect_left(ws, w)
        if i < len(ws) and ws[i] == w:
            return ts[i]
        if i == len(ws):  # past the last width: extend the last segment
            if len(ws) == 1:
                return ts[0]
            i = len(ws) - 1
        w0, w1, t0, t1 = ws[i - 1], ws[i], ts[i - 1], ts[i]
        return t0 + (t1 - t0) * (w - w0) / (w1 - w0)

    def table(self, upto: int | None = None) -> list[float]:
        """t(w) for w = 1..upto (default: the largest measured width), index w - 1."""
        return [self.t(w) for w in range(1, (upto or self.widths[-1]) + 1)]

    def floor(self, w: float) -> float | None:
        """The roofline floor of a w-row forward at this curve's context (None without a roofline)."""
        return None if self.roofline is None else self.roofline.floor(w, self.context_len)

    def to_json(self) -> dict:
        d = asdict(self)
        d["times_ms"] = {str(w): round(t * 1e3, 3) for w, t in zip(self.widths, self.times)}
        del d["times"]
        if self.roofline is None:  # as older files: no key at all
            del d["roofline"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CostCurve":
        if "times_ms" in d:
            widths = [int(w) for w in d["times_ms"]]
            times = [float(v) / 1e3 for v in d["times_ms"].values()]
        else:
            widths, times = d["widths"], d["times"]
        keep = {k: d[k] for k in ("model", "device", "dtype", "context_len", "repeats", "quick",
                                  "created", "versions", "roofline", "forward", "compile_seconds") if k in d}
        return cls(widths=widths, times=times, **keep)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CostCurve":
        return cls.from_json(json.loads(Path(path).read_text()))

    def speedup_bound(self, mat: float, mean_rows: float) -> float:
        """MAT x t(1) / t(mean rows per step)."""
        return mat * self.t(1) / self.t(mean_rows)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_")


def cache_path(model: str, device: str, dtype: str, forward: str = "eager") -> Path:
    from specbench.inputs.models import cache_root

    tail = "" if forward == "eager" else f"__{forward}"
    return cache_root() / "cost" / f"{_slug(model)}__{_slug(device)}__{_slug(dtype)}{tail}.json"


def load_cached(model: str, device: str, dtype: str, forward: str = "eager") -> CostCurve | None:
    path = cache_path(model, device, dtype, forward)
    return CostCurve.load(path) if path.is_file() else None


@torch.inference_mode()
def filled_cache_and_drafts(model, engine, widths, context_len: int):
    """What a timed step of w rows needs: the engine's cache holding `context_len` random tokens, those
    tokens, and per width a chain draft of w - 1 random tokens (None for a plain step). Seeded, so
    every profile of a model times the same steps."""
    from specbench.draft import Draft, DraftTree

    dev = engine.device
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (context_len,), generator=g)
    cache = engine.new_cache(context_len, max(widths))
    model(input_ids=prefix[None].to(dev), **with_cache(model, cache), use_cache=True, logits_to_keep=1)
    drafts = {w: None if w == 1 else Draft(tokens=torch.randint(0, vocab, (w - 1,), generator=g).to(dev),
                                           tree=DraftTree.chain(w - 1)) for w in widths}
    return cache, prefix, drafts


@torch.inference_mode()
def measure_cost_curve(model, widths=QUICK_WIDTHS, context_len: int = 400, repeats: int = 7,
                       warmup: int = 2, model_name: str = "", dtype_name: str | None = None,
                       quick: bool = False, progress: bool = False, machine: bool = False,
                       engine=None) -> CostCurve:
    """Median time of the engine's forward over w rows after `context_len` cached tokens; with
    `machine`, also the roofline (bandwidth and matmul throughput measured once per process).
    `engine` (default: an eager one) is the engine whose forward is timed; a compiled one compiles
    before the first timed call, and its compiling is reported apart."""
    from specbench.decoding.engine import Engine
    from specbench.decoding.kv_cache import compact_kv_cache

    widths = sorted({int(w) for w in widths} | {1})
    engine = engine or Engine(model, eos_token_ids=[])
    dev = engine.device
    cache, prefix, drafts = filled_cache_and_drafts(model, engine, widths, context_len)
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for rep in range(warmup + repeats):
        order = widths if rep % 2 == 0 else widths[::-1]
        for w in order:
            t0 = now(dev)
            engine.forward_rows(cache, context_len, drafts[w], root=int(prefix[-1]))
            dt = now(dev) - t0
            compact_kv_cache(cache, context_len, [])
            if rep >= warmup:
                samples[w].append(dt)
        if progress:
            print(f"  repeat {rep + 1}/{warmup + repeats}", flush=True)
    dtype = dtype_name or str(model.dtype).replace("torch.", "")
    return CostCurve(
        widths=widths, times=[statistics.median(samples[w]) for w in widths], model=model_name,
        device=device_name(dev), dtype=dtype, context_len=context_len, repeats=repeats, quick=quick,
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
        versions={"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        roofline=roofline_for(model) if machine else None,
        forward="eager" if engine.compiled is None else engine.compiled.name,
        compile_seconds=0.0 if engine.compiled is None else round(engine.compiled.compile_seconds, 1),
    )


# Quick curves measured in this process, by (model, device, dtype): the runner (for the bound) and
# adaptive TR (for its trees) then use one and the same curve.
_QUICK_CURVES: dict[tuple[str, str, str], CostCurve] = {}


def curve_for(model, model_name: str, dtype_name: str, measure: bool = True,
              context_len: int = 400, engine=None) -> CostCurve | None:
    """The profiled curve cached for this (model, device, dtype); else a quick one measured now
    (13 widths x 5 repeats, interleaved: about 10 s on this CPU, plus about a second for the
    roofline's bandwidth and matmul figures) and kept for this process only;
    or None when `measure` is false and nothing is at hand."""
    dev_name = device_name(model.device)
    forward = "eager" if engine is None or engine.compiled is None else engine.compiled.name
    cached = load_cached(model_name, dev_name, dtype_name, forward)
    if cached is not None:
        return cached
    key = (model_name, dev_name, dtype_name, forward)
    if key not in _QUICK_CURVES and measure:
        _QUICK_CURVES[key] = measure_cost_curve(model, QUICK_WIDTHS, context_len=context_len, repeats=5,
                                                warmup=1, model_name=model_name, dtype_name=dtype_name,
                                                quick=True, machine=True, engine=engine)
    return _QUICK_CURVES.get(key)


def load_curve_file(spec: str | Path) -> CostCurve:
    """A curve from its JSON file, refused with the fix when the file is missing or unreadable."""
    path = Path(spec)
    if not path.is_file():
        raise MissingFileError(f"cost curve file '{spec}' not found; write one with "
                               f"scripts/profile_cost.py --out {spec}, or leave the setting at auto")
    try:
        return CostCurve.load(path)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SettingsError(f"cost curve file '{spec}' is not a cost curve ({type(e).__name__}: {e}); write "
                            f"one with scripts/profile_cost.py --out {spec}, or leave the setting at auto") from None


def resolve_curve(spec=None, model=None, model_name: str = "", dtype_name: str | None = None,
                  engine=None) -> CostCurve:
    """A curve from a setting: a CostCurve, its JSON dict, a path to its JSON file, or None/'auto'
    for `curve_for(model, ...)`."""
    if isinstance(spec, CostCurve):
        return spec
    if isinstance(spec, dict):
        return CostCurve.from_json(spec)
    if spec not in (None, "auto"):
        return load_curve_file(spec)
    if model is None:
        raise ValueError("a cost curve is needed: give a curve file, or the model to measure one on")
    return curve_for(model, model_name, dtype_name or str(model.dtype).replace("torch.", ""), engine=engine)


def run_bound(curve: CostCurve | None, records: list[dict]) -> dict | None:
    """Speedup bound of a run from its answers' per-turn `step_rows` and `accept_lengths`.

    Returns None without a curve, or when a turn lacks its rows (answers from older runs)."""
    if curve is None:
        return None
    rows, acc = [], []
    for r in records:
        for t in r["turns"]:
            if "step_rows" not in t:
                return None
            rows.extend(t["step_rows"])
            acc.extend(t["accept_lengths"])
    if not rows:
        return None
    mat = sum(acc) / len(acc)
    mean_rows = sum(rows) / len(rows)
    t1 = curve.t(1)
    return {
        "bound": sum(acc) * t1 / sum(curve.t(w) for w in rows),
        "bound_mean_rows": curve.speedup_bound(mat, mean_rows),
        "mean_rows": mean_rows,
        "cost_curve": curve_label(curve) | {
            "t1_ms": round(t1 * 1e3, 3), "t_mean_rows_ms": round(curve.t(mean_rows) * 1e3, 3)},
    }


def curve_label(curve: CostCurve) -> dict:
    """What a summary says about the curve behind its bound."""
    return {"device": curve.device, "dtype": curve.dtype, "model": curve.model,
            "context_len": curve.context_len, "quick": curve.quick, "created": curve.created}

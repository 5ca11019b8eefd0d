"""The hardware's cost curve: time of one verification forward of w rows, and the speedup bound.

`measure_cost_curve` times the engine's own `forward_rows` for w rows after `context_len` cached
tokens (device-synchronised, the median per width). `scripts/profile_cost.py` measures the full
curve and caches it per (model, device name, dtype, contexts) under $SPECBENCH_CACHE/cost/;
`curve_for` loads it, or measures a quick curve that lives only in this process (only the profiler
writes the cache). A run's speedup bound, sum(accepted lengths) x t(1) / sum(t(rows of each step)),
is its speedup with zero harness overhead, prefill excluded. A curve may carry the machine's
roofline (roofline.py), and times at longer contexts (`contexts_for`), read at each step's own
context. Details: docs/cost-model.md.
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
from specbench.speculation.online_cost import REFRESH, RowCostCorrection
from specbench.decoding.kv_cache import with_cache
from specbench.timing import device_name, now

QUICK_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 81)
SHORT_CONTEXT = 400  # cached tokens before the timed forward of a one-context curve
CONTEXT_BUCKET = 256  # a drafter's table of t(w) is taken at its step's context rounded to this many tokens
LONG_CONTEXT = 1024  # a run whose turns stay within this many tokens is priced at the short context alone
ROWS_ROOM = 128  # a curve's longest context leaves the window room for this many rows


def non_decreasing(times: list[float]) -> list[float]:
    """The closest non-decreasing sequence to `times` in least squares (isotonic regression, pool
    adjacent violators): a forward over more rows never costs less. A noisy curve that dips (t(2)
    below t(1), a wide forward timed quicker than a narrow one) would price a wider tree below a
    narrower one and a method above its MAT; where the times already rise they are kept as they are."""
    blocks: list[list[float]] = []  # [mean, count] of pooled runs
    for t in times:
        blocks.append([float(t), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return [m for m, n in blocks for _ in range(int(n))]


def at_width(widths: list[int], times: list[float], w: float) -> float:
    """Time of w rows on one context's row of times: linear between measured widths, linear
    extrapolation past the last, the first width's time below it."""
    if w <= widths[0]:
        return times[0]
    i = bisect_left(widths, w)
    if i < len(widths) and widths[i] == w:
        return times[i]
    if i == len(widths):  # past the last width: extend the last segment
        if len(widths) == 1:
            return times[0]
        i = len(widths) - 1
    w0, w1, t0, t1 = widths[i - 1], widths[i], times[i - 1], times[i]
    return t0 + (t1 - t0) * (w - w0) / (w1 - w0)


def at_context(contexts: list[int], times: list[float], context: float) -> float:
    """Time at `context` from the times at the measured (increasing) contexts: linear between them;
    below the shortest, its time (what a one-context curve says there); past the longest, the last
    segment extended (attention's share grows linearly with the context), never below the longest's
    time (a noisy last segment must not make longer contexts cheaper)."""
    if len(contexts) == 1 or context <= contexts[0]:
        return times[0]
    i = min(bisect_left(contexts, context), len(contexts) - 1)
    c0, c1, t0, t1 = contexts[i - 1], contexts[i], times[i - 1], times[i]
    t = t0 + (t1 - t0) * (context - c0) / (c1 - c0)
    return max(t, times[-1]) if context > contexts[-1] else t


def contexts_for(longest_prompt_tokens: int, max_new_tokens: int, window: int | None = None,
                 short: int = SHORT_CONTEXT) -> tuple[int, ...]:
    """The contexts a run's curve is measured at: the short one, then 1024, 2048, ... up to the first
    that covers the run's longest context (longest prompt + max_new_tokens), that last one kept
    `ROWS_ROOM` inside the model's `window`. Powers of two, so that runs of different tasks share a
    cached curve; (short,) alone when the run never goes past LONG_CONTEXT, where a step costs about
    what it costs at the short one (docs/cost-model.md)."""
    longest = longest_prompt_tokens + max_new_tokens
    if longest <= LONG_CONTEXT:
        return (short,)
    cap = None if window is None else max(short, window - ROWS_ROOM)
    out, c = [short], 1024
    while out[-1] < longest and (cap is None or out[-1] < cap):
        out.append(c if cap is None else min(c, cap))
        c *= 2
    return tuple(out)


@dataclass
class CostCurve:
    """Median forward time (seconds) of w rows, for the measured widths, fitted non-decreasing in w;
    t(w) interpolates."""

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
    # the same widths timed after other numbers of cached tokens: context_times[i][j] is widths[j]'s
    # time after contexts[i] tokens (context_len's are `times`); empty in one-context curves
    contexts: list[int] = field(default_factory=list)
    context_times: list[list[float]] = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.roofline, dict):
            self.roofline = Roofline.from_json(self.roofline)
        widths = [int(w) for w in self.widths]
        order = sorted(range(len(widths)), key=widths.__getitem__)
        if not order or widths[order[0]] != 1:
            raise ValueError("a cost curve needs a time for w = 1 (the plain step)")
        if len(self.contexts) != len(self.context_times) or any(len(r) != len(widths) for r in self.context_times):
            raise ValueError("a cost curve needs one time per width at every context")
        if len({int(c) for c in self.contexts} | {self.context_len}) != len(self.contexts) + 1:
            raise ValueError(f"a cost curve's contexts must differ from each other and from context_len "
                             f"{self.context_len}, got {list(self.contexts)}")
        self.widths = [widths[i] for i in order]
        self.times = [float(self.times[i]) for i in order]
        rows = sorted((int(c), [float(r[i]) for i in order]) for c, r in zip(self.contexts, self.context_times))
        self.contexts = [c for c, _ in rows]
        self.context_times = [r for _, r in rows]
        # what t() reads: the measured times (kept as measured, and saved so) fitted non-decreasing in
        # rows at every context (`non_decreasing`); not a dataclass field, so never written to a file
        self._fitted = sorted((c, non_decreasing(ts)) for c, ts in
                              [(self.context_len, self.times), *zip(self.contexts, self.context_times)])
        self._fitted_times = dict(self._fitted)[self.context_len]

    def grid(self) -> list[tuple[int, list[float]]]:
        """(context, times per width fitted non-decreasing in rows) for every measured context, shortest first."""
        return self._fitted

    def t(self, w: float, context: float | None = None) -> float:
        """Forward time of w rows after `context` cached tokens: linear between measured widths and
        past the last (`at_width`), then between measured contexts (`at_context`). None, or a curve
        measured at one context: the time at context_len."""
        if context is None or not self.contexts:
            return at_width(self.widths, self._fitted_times, w)
        grid = self.grid()
        return at_context([c for c, _ in grid], [at_width(self.widths, ts, w) for _, ts in grid], context)

    def table(self, upto: int | None = None, context: float | None = None) -> list[float]:
        """t(w, context) for w = 1..upto (default: the largest measured width), index w - 1."""
        return [self.t(w, context) for w in range(1, (upto or self.widths[-1]) + 1)]

    def floor(self, w: float, context: float | None = None) -> float | None:
        """The roofline floor of a w-row forward after `context` cached tokens (default: the curve's
        context_len); None without a roofline."""
        if self.roofline is None:
            return None
        return self.roofline.floor(w, self.context_len if context is None else context)

    def to_json(self) -> dict:
        d = asdict(self)
        d["times_ms"] = {str(w): round(t * 1e3, 3) for w, t in zip(self.widths, self.times)}
        del d["times"], d["contexts"], d["context_times"]
        if self.contexts:  # one-context curves keep the older files' keys, and only those
            d["context_times_ms"] = {str(c): {str(w): round(t * 1e3, 3) for w, t in zip(self.widths, row)}
                                     for c, row in zip(self.contexts, self.context_times)}
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
        if "context_times_ms" in d:
            by_context = d["context_times_ms"]
            contexts = [int(c) for c in by_context]
            context_times = [[float(row[str(w)]) / 1e3 for w in widths] for row in by_context.values()]
        else:
            contexts, context_times = d.get("contexts", []), d.get("context_times", [])
        keep = {k: d[k] for k in ("model", "device", "dtype", "context_len", "repeats", "quick",
                                  "created", "versions", "roofline", "forward", "compile_seconds") if k in d}
        return cls(widths=widths, times=times, contexts=contexts, context_times=context_times, **keep)

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

    def speedup_bound(self, mat: float, mean_rows: float, context: float | None = None,
                      host_seconds: float = 0.0) -> float:
        """MAT x t(1) / (t(mean rows per step) + `host_seconds`, the drafter's host time a step), both
        after `context` cached tokens; never above the MAT (the curve never falls)."""
        return min(mat, mat * self.t(1, context) / (self.t(mean_rows, context) + host_seconds))


class StepTimes:
    """t(1..rows) at a step's context, for a drafter that weighs every width each step: one table per
    `CONTEXT_BUCKET` tokens of context, built on first use (a one-context curve has one table).

    `online`: the tables' shape corrected by the run's own timed steps (`learn`; online_cost.py), the
    factors updated every `REFRESH` steps; `version` changes with them, for a chooser's caches."""

    def __init__(self, curve: CostCurve, rows: int, online: bool = False):
        self.curve, self.rows = curve, rows
        self._curve_tables: dict[int | None, list[float]] = {}
        self._tables: dict[int | None, list[float]] = {}
        self.correction = RowCostCorrection(rows) if online else None
        self._factors: list[float] | None = None
        self.version = 0

    def key(self, context: int | None) -> int | None:
        """The bucket `context` falls in: None (the curve's own context) for None or a one-context curve."""
        if context is None or not self.curve.contexts:
            return None
        return round(context / CONTEXT_BUCKET) * CONTEXT_BUCKET

    def curve_at(self, context: int | None = None) -> list[float]:
        """The curve's own t(1..rows) at `context`, uncorrected."""
        key = self.key(context)
        table = self._curve_tables.get(key)
        if table is None:
            table = self._curve_tables[key] = self.curve.table(self.rows, key)
        return table

    def at(self, context: int | None = None) -> list[float]:
        key = self.key(context)
        table = self._tables.get(key)
        if table is None:
            table = self.curve_at(context)
            if self._factors is not None:  # corrected, and still never cheaper for more rows
                table = non_decreasing([t * f for t, f in zip(table, self._factors)])
            self._tables[key] = table
        return table

    def learn(self, rows: int, context: int | None, seconds: float | None) -> None:
        """A timed forward of `rows` rows after `context` cached tokens (None: not timed, nothing learnt)."""
        if self.correction is None or seconds is None:
            return
        self.correction.add(rows, seconds, self.curve_at(context)[min(rows, self.rows) - 1])
        if self.correction.steps % REFRESH == 0:
            self._factors = self.correction.factors()
            self._tables.clear()
            self.version += 1

    def forget(self) -> None:
        """The curve's tables again, nothing learnt (a drafter reset to its built state)."""
        if self.correction is not None:
            self.correction = RowCostCorrection(self.rows)
            self._factors = None
            self._tables.clear()
            self.version += 1


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_")


def longer_contexts(contexts=()) -> list[int]:
    """The contexts asked for beyond the short one, sorted: what a curve measures besides it."""
    return sorted({int(c) for c in contexts} - {SHORT_CONTEXT})


def cache_path(model: str, device: str, dtype: str, forward: str = "eager", contexts=()) -> Path:
    """The cached curve's file; one measured at longer contexts (`contexts_for`) has its own, so a
    short-context curve never stands in for a long task's."""
    from specbench.inputs.models import cache_root

    tail = "" if forward == "eager" else f"__{forward}"
    longer = longer_contexts(contexts)
    if longer:
        tail += "__ctx" + "-".join(map(str, longer))
    return cache_root() / "cost" / f"{_slug(model)}__{_slug(device)}__{_slug(dtype)}{tail}.json"


def load_cached(model: str, device: str, dtype: str, forward: str = "eager", contexts=()) -> CostCurve | None:
    path = cache_path(model, device, dtype, forward, contexts)
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
    # its widest step is known: no margin, so a short run's curve reuses the run's compiled capacity
    cache = engine.new_cache(context_len, max(widths), exact=True)
    model(input_ids=prefix[None].to(dev), **with_cache(model, cache), use_cache=True, logits_to_keep=1)
    drafts = {w: None if w == 1 else Draft(tokens=torch.randint(0, vocab, (w - 1,), generator=g).to(dev),
                                           tree=DraftTree.chain(w - 1)) for w in widths}
    return cache, prefix, drafts


@torch.inference_mode()
def time_widths(model, engine, widths: list[int], context_len: int, repeats: int, warmup: int,
                progress: bool = False) -> list[float]:
    """Median seconds of the engine's forward over each of `widths` rows after `context_len` cached
    tokens, the widths interleaved (forwards, then backwards) so that drift spreads evenly."""
    from specbench.decoding.kv_cache import compact_kv_cache

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
            print(f"  context {context_len}: repeat {rep + 1}/{warmup + repeats}", flush=True)
    return [statistics.median(samples[w]) for w in widths]


@torch.inference_mode()
def measure_cost_curve(model, widths=QUICK_WIDTHS, context_len: int = SHORT_CONTEXT, repeats: int = 7,
                       warmup: int = 2, model_name: str = "", dtype_name: str | None = None,
                       quick: bool = False, progress: bool = False, machine: bool = False,
                       engine=None, contexts=()) -> CostCurve:
    """Median time of the engine's forward over w rows after `context_len` cached tokens, and after
    each of `contexts` (one context after the other: only one filled cache is held at a time); with
    `machine`, also the roofline (bandwidth and matmul throughput measured once per process).
    `engine` (default: an eager one) is the engine whose forward is timed; a compiled one compiles
    before the first timed call, and its compiling is reported apart."""
    from specbench.decoding.engine import Engine

    widths = sorted({int(w) for w in widths} | {1})
    engine = engine or Engine(model, eos_token_ids=[])
    dev = engine.device
    times = time_widths(model, engine, widths, context_len, repeats, warmup, progress)
    longer = sorted({int(c) for c in contexts} - {context_len})
    context_times = [time_widths(model, engine, widths, c, repeats, warmup, progress) for c in longer]
    dtype = dtype_name or str(model.dtype).replace("torch.", "")
    return CostCurve(
        widths=widths, times=times, model=model_name,
        device=device_name(dev), dtype=dtype, context_len=context_len, repeats=repeats, quick=quick,
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
        versions={"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        roofline=roofline_for(model) if machine else None,
        forward="eager" if engine.compiled is None else engine.compiled.name,
        compile_seconds=0.0 if engine.compiled is None else round(engine.compiled.compile_seconds, 1),
        contexts=longer, context_times=context_times,
    )


# Quick curves measured in this process, by (model, device, dtype, forward, longer contexts): the
# runner (for the bound) and adaptive TR (for its trees) then use one and the same curve.
_QUICK_CURVES: dict[tuple, CostCurve] = {}


def curve_for(model, model_name: str, dtype_name: str, measure: bool = True,
              context_len: int = SHORT_CONTEXT, engine=None, contexts=()) -> CostCurve | None:
    """The profiled curve cached for this (model, device, dtype, forward, contexts); else a quick one
    measured now (13 widths x 5 repeats per context, interleaved: seconds at the short context, more
    at each longer one, plus the roofline's bandwidth and matmul figures; costs in docs/cost-model.md)
    and kept for this process only; or None when `measure` is false and nothing is at hand.
    `contexts`: the contexts the run meets (`contexts_for`), beside the short one."""
    dev_name = device_name(model.device)
    forward = "eager" if engine is None or engine.compiled is None else engine.compiled.name
    cached = load_cached(model_name, dev_name, dtype_name, forward, contexts)
    if cached is not None:
        return cached
    key = (model_name, dev_name, dtype_name, forward, tuple(longer_contexts(contexts)))
    if key not in _QUICK_CURVES and measure:
        _QUICK_CURVES[key] = measure_cost_curve(model, QUICK_WIDTHS, context_len=context_len, repeats=5,
                                                warmup=1, model_name=model_name, dtype_name=dtype_name,
                                                quick=True, machine=True, engine=engine,
                                                contexts=longer_contexts(contexts))
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


def _profile_flags(forward: str) -> str:
    return {"eager": "", "compiled": " --compile --products inductor", "compiled-packed": " --compile"}[forward]


def check_curve_file(spec: str, forward: str) -> None:
    """A curve file given to a run: readable, and measured on the forward the run plans (eager and
    compiled steps differ in cost), else refused with the profiler command or the `compile` setting
    that makes them agree."""
    if not isinstance(spec, str):
        raise SettingsError(f"cost_curve must be auto, off or a curve JSON path, got {spec!r}")
    measured_on = load_curve_file(spec).forward
    if measured_on != forward:
        raise SettingsError(
            f"cost_curve {spec}: measured on the {measured_on} forward, but this run uses the {forward} "
            f"one; profile it with scripts/profile_cost.py{_profile_flags(forward)} --out <file>, or set "
            f"compile={'off' if measured_on == 'eager' else 'on'}"
            + (f" compile_products={'packed' if measured_on == 'compiled-packed' else 'inductor'}"
               if measured_on != 'eager' else ""))


def resolve_curve(spec=None, model=None, model_name: str = "", dtype_name: str | None = None,
                  engine=None, contexts=()) -> CostCurve:
    """A curve from a setting: a CostCurve, its JSON dict, a path to its JSON file (with whatever
    contexts it holds), or None/'auto' for `curve_for(model, ..., contexts)`."""
    if isinstance(spec, CostCurve):
        return spec
    if isinstance(spec, dict):
        return CostCurve.from_json(spec)
    if spec not in (None, "auto"):
        return load_curve_file(spec)
    if model is None:
        raise ValueError("a cost curve is needed: give a curve file, or the model to measure one on")
    return curve_for(model, model_name, dtype_name or str(model.dtype).replace("torch.", ""), engine=engine,
                     contexts=contexts)


def prompt_tokens(turn: dict) -> int | None:
    """A turn's prompt length: its `input_tokens` (answers of newer runs), else its `prompt_ids` (held
    in memory while a run goes; answers.jsonl drops them); None when neither is there (older runs)."""
    if "input_tokens" in turn:
        return int(turn["input_tokens"])
    return len(turn["prompt_ids"]) if "prompt_ids" in turn else None


def step_contexts(prompt_len: int, accept_lengths: list[int]) -> list[int]:
    """Cached tokens before each step of a turn: the prompt, then what every earlier step emitted
    (the prefill's token is the first step's root, not yet in the cache)."""
    out, context = [], prompt_len
    for a in accept_lengths:
        out.append(context)
        context += a
    return out


def run_bound(curve: CostCurve | None, records: list[dict], drafter_host: bool = False) -> dict | None:
    """Speedup bound of a run from its answers' per-turn `step_rows` and `accept_lengths`: AR's time for
    each step's tokens over the step's own, both at the step's context where every turn says its
    prompt length (see `prompt_tokens`), else all at the curve's context_len.

    `drafter_host`: each step's time also holds the drafter's host seconds (its turns'
    `step_propose_times` + `step_observe_times`, where every turn records them): the prediction
    MAT x t(1) / (t(rows) + drafter host time), which, like the bound, never exceeds the MAT.
    Returns None without a curve, or when a turn lacks its rows (answers from older runs)."""
    if curve is None:
        return None
    rows, acc, contexts, host = [], [], [], []
    for r in records:
        for t in r["turns"]:
            if "step_rows" not in t:
                return None
            rows.extend(t["step_rows"])
            acc.extend(t["accept_lengths"])
            host.extend(_host_seconds(t) if drafter_host else [0.0] * len(t["step_rows"]))
            prompt = prompt_tokens(t)
            contexts.extend([None] * len(t["step_rows"]) if prompt is None
                            else step_contexts(prompt, t["accept_lengths"]))
    if not rows:
        return None
    if None in contexts:  # one turn without its prompt: all at one footing, a mixed bound would be neither
        contexts = [None] * len(rows)
    if None in host:  # a turn without the drafter's times: none counted, and the result says so
        host = [0.0] * len(rows)
        drafter_host = False
    mat = sum(acc) / len(acc)
    mean_rows = sum(rows) / len(rows)
    mean_context = None if contexts[0] is None else sum(contexts) / len(contexts)
    t1 = curve.t(1, mean_context)
    ar_time = sum(a * curve.t(1, c) for a, c in zip(acc, contexts))  # AR: one plain step per token
    step_time = sum(curve.t(w, c) + h for w, c, h in zip(rows, contexts, host))
    out = {
        "bound": min(mat, ar_time / step_time),
        "bound_mean_rows": curve.speedup_bound(mat, mean_rows, mean_context),
        "mean_rows": mean_rows,
        "mean_context": mean_context,  # cached tokens per step; None: the turns did not say their prompts
        "cost_curve": curve_label(curve) | {
            "t1_ms": round(t1 * 1e3, 3), "t_mean_rows_ms": round(curve.t(mean_rows, mean_context) * 1e3, 3)},
    }
    if drafter_host:
        out["drafter_host_ms"] = round(1e3 * sum(host) / len(host), 4)
    return out


def _host_seconds(turn: dict) -> list[float | None]:
    """A turn's drafter host seconds per step (propose + observe); None per step where it has none."""
    propose, observe = turn.get("step_propose_times"), turn.get("step_observe_times")
    if propose is None or observe is None:
        return [None] * len(turn["step_rows"])
    return [p + o for p, o in zip(propose, observe)]


def curve_label(curve: CostCurve) -> dict:
    """What a summary says about the curve behind its bound."""
    label = {"device": curve.device, "dtype": curve.dtype, "model": curve.model,
             "context_len": curve.context_len, "quick": curve.quick, "created": curve.created}
    if curve.contexts:
        label["contexts"] = [c for c, _ in curve.grid()]
    return label

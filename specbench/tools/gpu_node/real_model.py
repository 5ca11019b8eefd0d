"""The real-model stages: each method on the embedded model through the runner, in one process (the
model loads once), AR interleaved, every token checked, after a throwaway AR run that takes the
loading, conversion, rounding band, cost curve and the GPU's first use out of the first method's
figures. A method that fails is recorded and the next one runs; none starts without 1.5 times what the
median method so far took; `rounds` runs every method once before any twice.

The runner comes in as `ctx["runner"]`, a function from the settings' overrides to (summary, exit code,
lossless verdict line): `scripts/gpu_check.py` makes it from Hydra and `specbench.main`, which tools/
may not import (docs/architecture.md, rule 2)."""

from __future__ import annotations

import json
import statistics
import time
import traceback
from pathlib import Path

from specbench.intervals import round_stats
from specbench.tools.gpu_node.monitor import NodeSampler
from specbench.tools.gpu_node.node import node_paths

# Methods in the order their figures matter most, should a stage's time run out; EAGLE and Medusa last
# and together: the first of them compiles the hidden-state graphs (90 s on the H200, 2026-11-28), the
# other reuses them
PRIORITY = ["tr_fused", "tr", "tr_adaptive", "pld", "suffix", "samd", "lookahead", "rest", "sps", "eagle", "medusa"]
# The real-model stages' methods unless --methods says otherwise (`--methods all`: every registered one)
LEADING_METHODS = ["tr_fused", "tr", "tr_adaptive", "pld", "suffix"]
# New tokens per turn: 32 on the GPU (every method within real_model's budget, docs/gpu.md), 16 on the CPU
MAX_NEW_TOKENS = {"gpu": 32, "cpu": 16}
# The rehearsal's questions (CPU only). Half precision runs several times slower than float32 on a CPU
# without bfloat16 matrix units, and TR's 81 rows and the tree-choosing methods' quick curve pay it in
# full: one question there, so that all five leading methods fit the stage's time on CI's machine.
CPU_SUBTASKS = {"float32": ["translation", "math_reasoning"], "half": ["translation"]}
# The throwaway warm-up: AR on one question (and the runner's own warm-up, this many times over).
# On the GPU, Spec-Bench's first summarization question: it has the longest prompt of the six (769
# tokens), so the compiled forward's cache capacity, and its graphs, made in the warm-up serve every
# method after it. The CPU's stages run eager, with no capacity to make: the warm-up only pays for
# loading and the band, on the stage's own shortest question, once (CI's slow machine, 2026-12-01).
WARMUP_SUBTASK, WARMUP_REPEATS = "summarization", 2
CPU_WARMUP_REPEATS = 1
PASS, FAIL, PARTIAL, SKIP_TIME = "PASS", "FAIL", "PARTIAL", "SKIP(time)"


def method_order(available: list[str], wanted: list[str] | None = None) -> list[str]:
    """The methods to run, most valuable first (AR runs beside each, interleaved)."""
    pool = [m for m in available if m != "ar" and (wanted is None or m in wanted)]
    return [m for m in PRIORITY if m in pool] + sorted(m for m in pool if m not in PRIORITY)


def stage_methods(ctx: dict, default: list[str] | None = LEADING_METHODS) -> list[str]:
    """--methods, else `default` (None: every registered method), most valuable first."""
    from specbench.registry import available_methods

    wanted = None if ctx["methods"] == ["all"] else (ctx["methods"] or default)
    return method_order(available_methods(), wanted)


def cpu_precision(dtype: str) -> str:
    return "float32" if dtype == "float32" else "half"


def real_model_overrides(ctx: dict, dtype: str, forward: str, root: Path, warm_up: bool = False) -> list[str]:
    """The runner's settings for a real-model stage; `warm_up`: the throwaway AR run on one question."""
    cpu = not ctx["cuda"]
    questions = node_paths()["questions"] / "question.jsonl"
    repeats = (CPU_WARMUP_REPEATS if cpu else WARMUP_REPEATS) if warm_up else 1
    over = ["model=smollm2-135m", f"device={'cpu' if cpu else 'cuda'}", f"dtype={dtype}",
            f"compile={'on' if forward == 'compiled' else 'off'}", "baseline=interleave",
            f"warmup={repeats}", f"max_new_tokens={ctx['max_new_tokens']}",
            f"results_root={root}", "wandb.enabled=false", "progress=false", f"cost_curve={'off' if cpu else 'auto'}"]
    if questions.is_file():
        over += ["task=spec_bench", f"task.path={questions}", "task.per_subtask=1"]
        if warm_up:
            over += [f"task.subtasks=[{CPU_SUBTASKS[cpu_precision(dtype)][0] if cpu else WARMUP_SUBTASK}]"]
        elif cpu:
            over += [f"task.subtasks=[{','.join(CPU_SUBTASKS[cpu_precision(dtype)])}]"]
    else:  # the rehearsal without Spec-Bench's file: the built-in questions
        limit = 1 if warm_up else len(CPU_SUBTASKS[cpu_precision(dtype)]) if cpu else 12
        over += ["task=mini", f"task.limit={limit}"]
    return over


def answer_records(path: Path) -> list[dict]:
    """A run's answers.jsonl or baseline_answers.jsonl, a torn line (a run killed by its budget) left
    out; [] when there is none."""
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def median_step_ms(path: Path) -> float | None:
    """The median of every decoding step's time, in ms, over a run's answers (each turn's step_times)."""
    times = [t for r in answer_records(path) for turn in r.get("turns", []) for t in turn.get("step_times") or []]
    return round(statistics.median(times) * 1e3, 2) if times else None


def step_medians(summary: dict) -> dict:
    """Median method step and median AR step (ms) of a finished run: an AR disturbed by something
    outside the run shows as an AR step unlike the other methods' AR steps."""
    d = Path(summary.get("results_dir") or "/nonexistent")
    return {"step_ms": median_step_ms(d / "answers.jsonl"), "ar_step_ms": median_step_ms(d / "baseline_answers.jsonl")}


def turn_timeline(summary: dict) -> list[str]:
    """Each turn's median step (ms) in the order the run decoded them, AR's ('a') and the method's ('m')
    interleaved: a slow stretch shows whether it follows the method, AR or the clock."""
    d = Path(summary.get("results_dir") or "/nonexistent")
    first = ((summary.get("order") or {}).get("first") or {})

    def turns(path: Path) -> dict:
        return {str(r["question_id"]): [statistics.median(t["step_times"]) * 1e3 for t in r["turns"] if t.get("step_times")]
                for r in answer_records(path)}

    method, ar = turns(d / "answers.jsonl"), turns(d / "baseline_answers.jsonl")
    line = []
    for q, times in method.items():
        pair = [("m", times), ("a", ar.get(q, []))]
        for who, ts in (pair if first.get(q) == "method" else pair[::-1]):
            line += [f"{who}{t:.0f}" for t in ts]
    return line


def summary_row(s: dict, verdict: str) -> dict:
    """A finished run's figures for summary.md's table; `verdict`: the lossless check's line."""
    lo, sp = s["lossless"], s.get("speedup") or {}
    band = s.get("rounding_band") or {}  # the lossless check's band as measured on this device
    return {"speedup": sp.get("overall"), "decode_speedup": (s.get("decode_speedup") or {}).get("overall"),
            "bound": s.get("speedup_bound"), "predicted": s.get("speedup_predicted"), "mat": s["mat"], "rows_per_step": s.get("rows_per_step"),
            "tokens_per_s": s["tokens_per_s"], "ar_tokens_per_s": s.get("baseline_tokens_per_s"),
            "questions": s["questions"], "forward_used": s.get("forward"), "lossless": verdict,
            "tokens_checked": lo.get("tokens_checked"), "tokens_outside_band": lo.get("tokens_outside_band"),
            "mismatches": lo.get("mismatches"), "device": s.get("device"),
            "band_ulps": band.get("band_ulps"), "band_measured_logits": band.get("measured_logits"),
            "speedup_ci": s.get("speedup_ci"), "drafter_host_ms": s.get("drafter_host_ms"),
            "step_split_ms": s.get("step_split_ms"), "ar_step_split_ms": s.get("baseline_step_split_ms")}


def _failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def warm_up(ctx: dict, name: str, overrides: list[str]) -> dict:
    """The throwaway AR run; its failure is recorded and the methods still run (the first pays for loading)."""
    start = time.time()
    print(f"gpu_check: {name}: warm-up (AR on one question, not counted)", flush=True)
    try:
        summary, _, _ = ctx["runner"](["method=ar", *overrides])
        warm = {"status": "ok", **step_medians(summary)}
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - a CUDA error, a SystemExit: the methods still run
        warm = {"status": _failure(e)}
        (ctx["work"] / f"{name}_warmup.traceback").write_text(traceback.format_exc())
    warm["kernels"], warm["kernels_seconds"] = build_host_kernels()
    warm["seconds"] = round(time.time() - start, 1)
    warm["ar_step_ms"] = warm.pop("step_ms", None)
    print(f"  {name}: warm-up {warm['status']} in {warm['seconds']:.0f} s (AR median step "
          f"{warm['ar_step_ms']} ms; our CPU kernels {warm['kernels']} in {warm['kernels_seconds']:.0f} s)", flush=True)
    return warm


def build_host_kernels() -> tuple[str, float]:
    """Our C++ extension (the drafters' host kernels; on a CPU the packed forward) built here, in the
    warm-up: on a new node it compiles for minutes (CI's twin, 2026-12-01: a bfloat16 stage's first
    method took 312 s, 76 s once built), which AR alone never asks for, and it would fall on the first
    TR-family method's time. Its failure is said and the methods fall back, as in any run."""
    from specbench.decoding import packed_linear

    start = time.time()
    try:
        problem = packed_linear.build_problem()
    except Exception as e:  # noqa: BLE001 - the methods say it again and fall back
        problem = _failure(e)
    return ("built" if problem is None else f"unavailable: {problem}"), round(time.time() - start, 1)


def run_method(ctx: dict, name: str, method: str, overrides: list[str], row: dict) -> dict:
    """One method through the runner; what went wrong is its row's status, never the stage's end."""
    from specbench.errors import SpecbenchError

    try:
        summary, code, verdict = ctx["runner"]([f"method={method}", *overrides])
        row.update(summary_row(summary, verdict), **step_medians(summary), turns=turn_timeline(summary),
                   status="ok" if code == 0 else "lossless check failed")
    except SpecbenchError as e:
        row.update(status=f"error: {e}")
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - a CUDA error, a bug, a SystemExit: recorded, the next one runs
        row.update(status=_failure(e))
        (ctx["work"] / f"{name}_{method}.traceback").write_text(traceback.format_exc())
    return row


def run_methods(ctx: dict, name: str, dtype: str, forward: str, methods: list[str], rounds: int = 1) -> dict:
    """The warm-up, then each method while the stage's time allows, `rounds` times over (every method
    once before any twice, so a short slot still has each); the rows are written after each, so a
    budget that ends the stage leaves those done."""
    root = ctx["work"] / "runs" / name
    sampler = NodeSampler(ctx["work"], name) if ctx["cuda"] else None
    warm = warm_up(ctx, name, real_model_overrides(ctx, dtype, forward, root / "warmup", warm_up=True))
    rows, took_so_far = [], []
    for rnd in range(1, rounds + 1):
        # each round a folder of its own: a run in the same folder would resume, not run again
        where = root if rounds == 1 else root / f"round{rnd}"
        for m in methods:
            left = ctx["deadline"] - time.time()
            # the guide: the median method so far, not the last (one that compiled graphs of its own,
            # EAGLE's hidden states, must not make every method after it look unaffordable)
            if left < 1.5 * (statistics.median(took_so_far) if took_so_far else 0.0):
                rows.append({"method": m, "round": rnd, "status": SKIP_TIME})
                continue
            print(f"gpu_check: {name}: {m}, round {rnd} of {rounds} ({left:.0f} s left)", flush=True)
            start = time.time()
            row = run_method(ctx, name, m, real_model_overrides(ctx, dtype, forward, where),
                             {"method": m, "round": rnd, "forward": forward, "dtype": dtype})
            took = time.time() - start
            if rows or warm["status"] == "ok":  # a guide only when the warm-up paid for loading
                took_so_far.append(took)
            row["seconds"], row["started"] = round(took, 1), round(start, 1)
            rows.append(row)
            print(f"  {name}: {m} {row['status']} in {took:.0f} s (median step {row.get('step_ms')} ms, "
                  f"AR {row.get('ar_step_ms')} ms)", flush=True)
            (ctx["work"] / f"{name}.json").write_text(json.dumps(rows, indent=1))
    return methods_result(rows, warm, sampler.stop() if sampler else {}, dtype, forward)


def short_of_time_only(result: dict) -> bool:
    """A real-model stage's result that only ran short of time: PARTIAL, some method ok and every
    other one skipped for time (a stage its budget ended keeps the methods it finished: driver.py)."""
    statuses = {r.get("status") for r in result.get("rows") or []}
    return result.get("status") == PARTIAL and "ok" in statuses and statuses <= {"ok", SKIP_TIME}


def methods_result(rows: list[dict], warm: dict, node: dict, dtype: str, forward: str) -> dict:
    """The stage's status and detail: PASS when every method ran at least once and none failed,
    PARTIAL when the time ran out before some method's first run."""
    bad = [r for r in rows if r["status"] not in ("ok", SKIP_TIME)]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    done = {m: sum(r["method"] == m and r["status"] == "ok" for r in rows) for m in methods}
    never = [m for m in methods if not any(r["method"] == m and r["status"] != SKIP_TIME for r in rows)]
    detail = f"{sum(n > 0 for n in done.values())}/{len(methods)} methods ok ({dtype}, {forward})"
    if max(r.get("round", 1) for r in rows or [{}]) > 1:
        detail += "; rounds per method: " + " ".join(f"{m} {n}" for m, n in done.items())
    if bad:
        detail += "; " + "; ".join(f"{r['method']}: {r['status']}" for r in bad)
    if never:
        detail += f"; no time for {', '.join(never)}"
    if warm["status"] != "ok":
        detail += f"; warm-up: {warm['status']}"
    status = FAIL if bad else (PARTIAL if never else PASS)
    return {"status": status, "detail": detail, "rows": rows, "warmup": warm, "node": node,
            "rounds": {m: round_stats([r["speedup"] for r in rows if r["method"] == m and r.get("speedup")])
                       for m in methods}}

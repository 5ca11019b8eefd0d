"""Predicted speedups of each method on a cost curve: MAT x t(1) / (t(rows per step) + drafter host time).

Two sources of (MAT, rows per step): the published MATs (results/published/) with the published
setting's rows (`PUBLISHED_ROWS`) or this harness's (`HARNESS_METHODS`), and this harness's
committed CPU traces (`CURRENT_TRACES`) replayed step by step on the curve (`cost.run_bound`), with
each step's drafter host time (propose + observe) where the trace records it. The curve is fitted
non-decreasing in rows, so no prediction exceeds its MAT. AR is left out (1 by definition). Sources
in detail: docs/cost-model.md; reading them: docs/gpu.md.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

from specbench import markdown
from specbench.speculation.cost import CostCurve, run_bound

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED_DIR = ROOT / "results" / "published"

# source label -> file in results/published/
PUBLISHED_FILES = {"Spec-Bench A100": "specbench_leaderboard_a100.csv",
                   "TR paper A100": "token_recycling_paper_table.csv"}

# The published model each real shape is.
PUBLISHED_MODELS = {"vicuna-7b": "vicuna-7b-v1.3", "vicuna-13b": "vicuna-13b-v1.3"}

# Rows per step where the published setting fixes them: (rows, why).
PUBLISHED_ROWS = {
    "tr": (81, "published: 80-node tree + root"),
    "medusa": (64, "published: mc_sim_7b_63, 63 nodes + root"),
    "eagle2": (60, "published: total_token 59 + root"),
}

# Published method name -> this harness's method of the same algorithm (for rows from its runs).
HARNESS_METHODS = {"tr": "tr", "medusa": "medusa", "eagle2": "eagle", "pld": "pld", "rest": "rest",
                   "lookahead": "lookahead", "sps": "sps"}

# The current committed CPU sweeps (results/README.md): the headline, every method at T = 0 and 0.7; where
# several folders are given, the first holding a method wins.
CURRENT_TRACES = ("results/cpu-headline-v3",)


def predicted_speedup(curve: CostCurve, mat: float, rows: float, host_seconds: float = 0.0) -> float:
    """MAT x t(1) / (t(rows) + host_seconds): the speedup of a method verifying `rows` per step at `mat`
    tokens per step, its drafter spending `host_seconds` a step on the host; never above `mat`."""
    return curve.speedup_bound(mat, rows, host_seconds=host_seconds)


def read_published(path: str | Path) -> list[dict]:
    """The rows of a results/published/ CSV (comment lines start with '#')."""
    lines = [line for line in Path(path).read_text().splitlines() if line and not line.startswith("#")]
    return list(csv.DictReader(lines))


def greedy_runs(folders, root: Path = ROOT, temperature: str = "0") -> list[Path]:
    """The greedy (`-t0-`) run directories holding answers under `folders`, folder by folder, AR's
    left out; `temperature`: another one's as its directories spell it (`0.7`)."""
    tag = f"-t{temperature}-"
    runs = []
    for folder in folders:  # folder by folder: read_traces takes a method from the first that holds it
        found = {a.parent for pattern in ("**/answers.jsonl", "**/answers.jsonl.gz") for a in (root / folder).glob(pattern)}
        runs += [run for run in sorted(found) if tag in run.name and not run.name.startswith("ar-")]
    return runs


def read_answers(run: Path) -> list[dict]:
    """A run's answers, from answers.jsonl or, where a folder keeps it gzipped, answers.jsonl.gz."""
    path = run / "answers.jsonl"
    text = path.read_text() if path.is_file() else gzip.decompress((run / "answers.jsonl.gz").read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_traces(folders=CURRENT_TRACES, root: Path = ROOT) -> dict[str, tuple[list[dict], str]]:
    """method -> (its answers.jsonl records, run directory relative to `root`), from greedy runs
    under `folders`; the first folder holding a method wins."""
    traces: dict[str, tuple[list[dict], str]] = {}
    for run in greedy_runs(folders, root):
        records = read_answers(run)
        method = records[0]["method"] if records else None
        if method and method != "ar" and method not in traces:
            traces[method] = (records, str(run.relative_to(root)))
    return traces


def trace_mean_rows(records: list[dict]) -> float | None:
    """Mean rows per verification forward over a run's turns (None without `step_rows`)."""
    rows = [w for r in records for t in r["turns"] for w in t.get("step_rows", [])]
    return sum(rows) / len(rows) if rows else None


def published_rows_per_step(method: str, traces: dict) -> tuple[float | None, str]:
    """(rows per step, where they come from) for a published method."""
    if method in PUBLISHED_ROWS:
        return PUBLISHED_ROWS[method]
    ours = HARNESS_METHODS.get(method)
    if ours in traces:
        records, run = traces[ours]
        rows = trace_mean_rows(records)
        if rows is not None:
            return rows, f"harness run {run} (mean)"
    return None, "not published, no harness run"


def published_predictions(curve: CostCurve, shape: str, traces: dict,
                          published_dir: Path = PUBLISHED_DIR) -> list[dict]:
    """One row per published method for the Vicuna model of `shape` (a real shape: none for others)."""
    model = PUBLISHED_MODELS.get(shape)
    if model is None:
        return []
    out = []
    for source, file in PUBLISHED_FILES.items():
        for p in read_published(published_dir / file):
            if p["model"] != model or p["method"] == "ar":
                continue
            mat = float(p["mat"])
            rows, rows_from = published_rows_per_step(p["method"], traces)
            out.append({"method": p["method"], "source": f"{source} ({model})", "mat": mat, "mean_rows": rows,
                        "rows_from": rows_from,
                        "predicted": None if rows is None else predicted_speedup(curve, mat, rows),
                        "published": float(p["overall_speedup"])})
    return out


def trace_predictions(curve: CostCurve, traces: dict) -> list[dict]:
    """One row per harness run: its steps replayed on `curve` (`cost.run_bound`)."""
    out = []
    for method, (records, run) in traces.items():
        bound = run_bound(curve, records, drafter_host=True)
        if bound is None:
            continue
        acc = [a for r in records for t in r["turns"] for a in t["accept_lengths"]]
        host = bound.get("drafter_host_ms")
        out.append({"method": method, "source": f"trace {run}", "mat": sum(acc) / len(acc),
                    "mean_rows": bound["mean_rows"],
                    "rows_from": "trace, step by step" + ("" if host is None else f", drafter {host:.2f} ms/step"),
                    "predicted": bound["bound"], "published": None})
    return out


def predictions(curve: CostCurve, shape: str, folders=CURRENT_TRACES, root: Path = ROOT,
                published_dir: Path = PUBLISHED_DIR) -> list[dict]:
    """Published rows for `shape`'s Vicuna model (a tiny shape: the real shape it stands in for),
    then the harness's traces, each with its predicted speedup on `curve`."""
    from specbench.speculation.shapes import real_shape

    traces = read_traces(folders, root)
    return (published_predictions(curve, real_shape(shape), traces, published_dir)
            + trace_predictions(curve, traces))


def _fmt(x, spec: str, unit: str = "") -> str:
    return "-" if x is None else format(x, spec) + unit


def markdown_table(rows: list[dict]) -> str:
    """The prediction rows as a markdown table."""
    return markdown.markdown_table(["method", "source", "MAT", "rows/step", "rows from", "predicted", "published"],
                          [[r["method"], r["source"], f"{r['mat']:.2f}", _fmt(r["mean_rows"], ".1f"), r["rows_from"],
                            _fmt(r["predicted"], ".2f", "x"), _fmt(r["published"], ".2f", "x")] for r in rows],
                          align="llrrlrr")

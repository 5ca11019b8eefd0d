"""Serving runs (`run.py batch_size=` / `request_rate=`) gathered into one table and two plots.

Each serving run directory holds a summary.json with the method's figures beside its own batched AR's,
timed in the same process on the same requests, batch size and arrivals. Runs that differ only in
`repeat` are rounds of one configuration. Its speedup is the mean of the rounds' own ratios
(throughput for a closed batch; AR's mean latency over the method's under arrivals), not a ratio of
means: each round's AR ran minutes from its method, and this machine drifts by ~10% over a sweep.
Beside it go the rounds' range and the 95% interval of that mean; the lossless tallies are summed.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from specbench.markdown import markdown_table
from specbench.report import timing_marks
from specbench.run import lossless
from specbench.run.metrics import mean_interval_95
from specbench.run.results_io import read_json
from specbench.run.session import SERVING_CONFIG  # what marks a serving run's directory

IDENTITY = ("model", "task", "dtype", "device", "forward", "max_new_tokens")  # one table each


def load_serving(root: Path) -> list[dict]:
    """Every finished serving run's summary under `root` (a serving run directory counts itself)."""
    root = Path(root)
    dirs = [root] if (root / SERVING_CONFIG).is_file() else sorted(p.parent for p in root.rglob(SERVING_CONFIG))
    return [dict(read_json(d / "summary.json"), results_dir=str(d)) for d in dirs if (d / "summary.json").is_file()]


def speedup_of(summary: dict) -> float | None:
    """A run's own speedup over the AR it timed beside it: throughput for a closed batch, mean latency
    under arrivals. None for AR itself, or a run made with baseline=none."""
    return summary.get("latency_speedup") if summary.get("request_rate") else summary.get("speedup")


def labels(summaries: list[dict]) -> dict[str, str]:
    """Each run's method as the table names it: the method, and where it ran in several variants, the
    settings that tell them apart."""
    params: dict[str, list[dict]] = {}
    for s in summaries:
        params.setdefault(s["method"], []).append(s.get("method_params") or {})
    out = {}
    for s in summaries:
        seen = params[s["method"]]
        differing = sorted(k for k in set().union(*seen) if len({json.dumps(p.get(k)) for p in seen}) > 1)
        p = s.get("method_params") or {}
        out[s["results_dir"]] = s["method"] + (f" ({', '.join(f'{k}={p.get(k)}' for k in differing)})"
                                               if differing else "")
    return out


def combine(summaries: list[dict]) -> list[dict]:
    """One entry per configuration (the runs that differ only in `repeat`), in table order."""
    name = labels(summaries)
    groups: dict[tuple, list[dict]] = {}
    for s in summaries:
        key = (*(s.get(k) for k in IDENTITY), name[s["results_dir"]], s.get("batch_speculation"),
               s["batch_size"], s.get("request_rate"))
        groups.setdefault(key, []).append(s)
    out = []
    for key, runs in groups.items():
        ratios = [x for x in map(speedup_of, runs) if x is not None]
        mean = lambda k: statistics.mean(r[k] for r in runs)  # noqa: E731
        tallies = [r["lossless"] for r in runs]
        out.append({
            **dict(zip(IDENTITY, key)), "method": key[len(IDENTITY)], "speculation": key[-3],
            "batch_size": key[-2], "request_rate": key[-1], "rounds": len(runs),
            "throughput": mean("throughput"), "mat": mean("mat"), "rows_per_step": mean("rows_per_step"),
            "latency_mean": mean("latency_mean"), "latency_p50": mean("latency_p50"),
            "latency_p99": mean("latency_p99"),
            "tpot_ms": statistics.mean(r["tpot_ms"] for r in runs) if all(r.get("tpot_ms") for r in runs) else None,
            "speedup": statistics.mean(ratios) if ratios else None,
            "low": min(ratios, default=None), "high": max(ratios, default=None), "ci95": mean_interval_95(ratios),
            "lossless": {k: sum(t.get(k, 0) for t in tallies) for k in
                         ("questions", "checked", "exact", "numeric_ties", "mismatches", "lossy_differences",
                          "tokens_checked", "tokens_outside_band", "questions_outside_band")
                         if any(k in t for t in tallies)},
            "timing_flags": timing_marks.merged([timing_marks.summary_flags(r) for r in runs]),
        })
    return sorted(out, key=lambda r: (*(str(r[k]) for k in IDENTITY), r["request_rate"] is not None,
                                      r["request_rate"] or 0, r["method"] != "ar", r["method"], r["speculation"],
                                      r["batch_size"]))


def speedup_cell(r: dict) -> str:
    if r["speedup"] is None:
        return "-"
    if r["rounds"] < 2:
        return f"{r['speedup']:.2f}x"
    return f"{r['speedup']:.2f}x ({r['low']:.2f}-{r['high']:.2f})"


def serving_markdown(combined: list[dict]) -> str:
    """One table per model, task, dtype, device, forward and max_new_tokens: closed batches, then arrivals."""
    out = ["# Serving runs", "", "Speedup over batched AR at the same batch size and arrivals, timed in the same "
           "run: throughput for a closed batch, mean latency under Poisson arrivals. Over several rounds "
           "(`repeat=`): the mean of the rounds' own ratios, their range in brackets and the mean's 95% "
           "interval (Student's t); where the interval holds 1 the rounds do not tell the method from AR. "
           "Latency: finish - arrival, seconds.", ""]
    tables: dict[tuple, list[dict]] = {}
    for r in combined:
        tables.setdefault(tuple(r[k] for k in IDENTITY), []).append(r)
    for ident, rows in tables.items():
        out += [f"## {', '.join(f'{k} {v}' for k, v in zip(IDENTITY, ident))}", "", serving_table(rows), ""]
        note = timing_marks.footnote(rows, lambda r: f"{r['method']} B={r['batch_size']}")
        if note:
            out += [note + ".", ""]
    return "\n".join(out)


def serving_table(combined: list[dict]) -> str:
    """The table of combined serving runs (combine), as printed after a run and written to serving.md."""
    body = [[timing_marks.marked(r["method"], r.get("timing_flags")), r["speculation"], r["batch_size"],
             f"{r['request_rate']:g}" if r["request_rate"] else "-", r["rounds"], f"{r['throughput']:.1f}",
             speedup_cell(r), "-" if r["ci95"] is None else f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}",
             f"{r['mat']:.2f}", f"{r['rows_per_step']:.1f}",
             f"{r['latency_mean']:.2f} / {r['latency_p50']:.2f} / {r['latency_p99']:.2f}",
             "-" if r["tpot_ms"] is None else f"{r['tpot_ms']:.1f}",
             lossless.verdict_line(r["lossless"]) if r["lossless"].get("checked") else "unchecked"]
            for r in combined]
    return markdown_table(["method", "speculation", "B", "rate (req/s)", "rounds", "tok/s", "speedup", "95% CI",
                           "MAT", "rows/step", "latency mean / p50 / p99", "TPOT ms", "lossless"],
                          body, align="llrrrrrrrrlrl")


def serving_plots(combined: list[dict], out: Path) -> list[Path]:
    """speedup_vs_batch.png (closed batches) and latency_vs_rate.png (arrivals), where there are runs:
    one colour a method, goodput solid and fixed speculation dashed, the rounds' range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for arrivals, x, name, xlabel, ylabel in (
            (False, "batch_size", "speedup_vs_batch", "batch size B (closed batch)", "throughput / batched AR's"),
            (True, "request_rate", "latency_vs_rate", "request rate (requests / s, Poisson)",
             "AR's mean latency / the method's")):
        rows = [r for r in combined if (r["request_rate"] is not None) == arrivals and r["speedup"] is not None]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        methods = sorted({r["method"] for r in rows})
        for method, spec in sorted({(r["method"], r["speculation"]) for r in rows}):
            pts = sorted((r[x], r["speedup"], r["low"], r["high"]) for r in rows
                         if (r["method"], r["speculation"]) == (method, spec))
            xs, ys, lo, hi = zip(*pts)
            line, = ax.plot(xs, ys, marker="o", linestyle="-" if spec == "goodput" else "--",
                            color=f"C{methods.index(method) % 10}", label=f"{method} ({spec})")
            if any(h > low for low, h in zip(lo, hi)):
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
        ax.axhline(1.0, color="grey", lw=0.8)
        if not arrivals:
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r[x] for r in rows}))
            ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=120)
        plt.close(fig)
        written.append(out / f"{name}.png")
    return written


def failures(combined: list[dict]) -> list[str]:
    """The configurations that fail the lossless check, one line each."""
    bad = []
    for r in combined:
        lo = r["lossless"]
        missing = lo.get("questions", lo.get("checked", 0)) - lo.get("checked", 0)
        if lo.get("mismatches") or lo.get("tokens_outside_band") or missing:
            bad.append(f"{r['method']} {r['speculation']} B={r['batch_size']} rate={r['request_rate']}: "
                       f"{lossless.verdict_line(lo)}")
    return bad

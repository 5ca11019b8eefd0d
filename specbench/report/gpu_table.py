"""The README's GPU table, generated from one lent slot's `gpu_check` output (its calls' `stages.json`):
each method's speedup with its interval, its decode speedup beside the prediction from its MAT, the
slot's cost curve and its drafter's measured host time, its step against AR's, and its lossless tally.

    python scripts/gpu_table.py results/gpu/h200-2026-11-28-run1 results/gpu/h200-2026-11-28-run2 --readme README.md

A method run in several rounds shows the mean of its rounds and their 95% t-interval; run once, the
bootstrap interval over its questions. Where two calls of the slot ran a method, the rows of both count.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from specbench import markdown
from specbench.intervals import round_stats

BEGIN, END = "<!-- gpu-table: begin (scripts/gpu_table.py) -->", "<!-- gpu-table: end -->"


def slot_rows(folders: list[Path], stage: str = "real_model_compiled") -> list[dict]:
    """Every finished row of `stage` in the slot's calls, in the order run."""
    rows = []
    for folder in folders:
        stages = json.loads((Path(folder) / "stages.json").read_text())
        rows += [r for r in (stages.get(stage) or {}).get("rows", []) if r.get("status") == "ok" and r.get("mat")]
    return rows


def method_figures(rows: list[dict]) -> list[dict]:
    """One entry per method: its rows' figures, means over rounds, fastest first."""
    out = []
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]

        def mean(key):
            vals = [r[key] for r in mine if r.get(key) is not None]
            return statistics.fmean(vals) if vals else None

        st = round_stats([r["speedup"] for r in mine])
        interval = st.get("interval") or (mine[0].get("speedup_ci") if len(mine) == 1 else None)
        host = [sum((r.get("drafter_host_ms") or {}).values()) for r in mine]
        out.append({"method": m, "rounds": len(mine), "speedup": st["mean"], "interval": interval,
                    "decode": mean("decode_speedup"), "bound": mean("bound"), "predicted": mean("predicted"), "mat": mean("mat"),
                    "rows": mean("rows_per_step"), "step_ms": mean("step_ms"), "ar_step_ms": mean("ar_step_ms"),
                    "drafter_ms": statistics.fmean(host),
                    "checked": sum(r.get("tokens_checked") or 0 for r in mine),
                    "outside": sum(r.get("tokens_outside_band") or 0 for r in mine),
                    "mismatches": sum(r.get("mismatches") or 0 for r in mine)})
    return sorted(out, key=lambda f: -f["speedup"])


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _n(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(figures: list[dict]) -> str:
    rows = [[f["method"], f"{_x(f['speedup'])} ({'-' if not f['interval'] else _x(f['interval'][0]) + '-' + _x(f['interval'][1])})",
             _x(f["decode"]), _x(f["bound"]), _x(f["predicted"]), _n(f["mat"], ".2f"), _n(f["rows"], ".0f"),
             f"{_n(f['step_ms'], '.1f')} / {_n(f['ar_step_ms'], '.1f')}", _n(f["drafter_ms"], ".2f"),
             f"{f['checked']} ({f['outside']}{'' if not f['mismatches'] else ', ' + str(f['mismatches']) + ' mismatched'})"]
            for f in figures]
    return markdown.markdown_table(
        ["method", "speedup (95% interval)", "decode", "bound", "predicted", "MAT", "rows", "step ms / AR's", "drafter ms",
         "tokens checked (outside band)"], rows, align="lrrrrrrrrr")


def replace_block(text: str, block: str) -> str:
    """`text` with what lies between the markers replaced by `block`; refused without both markers."""
    return markdown.replace_between(text, block, BEGIN, END)

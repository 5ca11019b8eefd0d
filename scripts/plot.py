"""Plots of a results root, PNG and PDF (pip install -e ".[plots]").

    python scripts/plot.py results/ [--out results/plots] [--formats png,pdf]
    python scripts/plot.py --cost-curves a/cost_curve.json b/cost_curve.json ... --out DIR

Per setting (model / task / temperature / ...): speedup per subtask per method (grouped bars),
MAT per method, distribution of accepted lengths per method, acceptance by draft depth per method
(where the answers record step_drafted), tokens/s over the run, and where the subtasks are
input-length buckets (task=long), speedup against input length per method; per setting
without temperature: overall speedup against temperature. Files: <plot>__<setting>.{png,pdf}.
With --cost-curves: t(w) / t(1) of each named cost curve on one plot, DIR/cost_curves.{png,pdf}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.report import collect, plots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", default="results")
    ap.add_argument("--out", help="default: <root>/plots")
    ap.add_argument("--formats", default="png,pdf")
    ap.add_argument("--cost-curves", nargs="+", metavar="JSON", help="plot these cost curves instead")
    args = ap.parse_args(argv)
    if args.cost_curves:
        import json

        curves = [json.loads(Path(p).read_text()) for p in args.cost_curves]
        out = Path(args.out or ".")
        print(plots.save(plots.cost_curves(curves), out, "cost_curves", tuple(args.formats.split(","))))
        return 0
    root = Path(args.root)
    runs = collect.load_runs(root)
    if not runs:
        print(f"no run directories under {root}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else root / "plots"
    written = plots.save_all(collect.frames(runs), out, tuple(args.formats.split(",")))
    for p in written.values():
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())

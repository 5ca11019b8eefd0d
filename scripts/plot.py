"""Plots of a results root, PNG and PDF (pip install -e ".[plots]").

    python scripts/plot.py results/ [--out results/plots] [--formats png,pdf]

Per setting (model / task / temperature / ...): speedup per subtask per method (grouped bars),
MAT per method, distribution of accepted lengths per method, acceptance by draft depth per method
(where the answers record step_drafted), tokens/s over the run, and where the subtasks are
input-length buckets (task=long), speedup against input length per method; per setting
without temperature: overall speedup against temperature. Files: <plot>__<setting>.{png,pdf}.
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
    args = ap.parse_args(argv)
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

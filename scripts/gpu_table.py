"""The README's GPU table from one lent slot's gpu_check output (specbench/report/gpu_table.py).

    python scripts/gpu_table.py results/gpu/h200-2026-11-28-run1 results/gpu/h200-2026-11-28-run2 \
        --out results/gpu/h200-2026-11-28-run1/table.md --readme README.md

Prints the table; `--out` writes it; `--readme` replaces the block between the README's gpu-table markers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.report.gpu_table import method_figures, replace_block, slot_rows, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", help="the slot's gpu_check output folders (each with stages.json)")
    ap.add_argument("--stage", default="real_model_compiled")
    ap.add_argument("--out", default=None)
    ap.add_argument("--readme", default=None)
    args = ap.parse_args(argv)
    missing = [f for f in args.folders if not (Path(f) / "stages.json").is_file()]
    if missing:
        print(f"error: no stages.json in {', '.join(missing)}: give the folders gpu_check's calls brought back",
              file=sys.stderr)
        return 2
    text = table(method_figures(slot_rows([Path(f) for f in args.folders], args.stage)))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.readme:
        readme = Path(args.readme)
        readme.write_text(replace_block(readme.read_text(), text))
    return 0


if __name__ == "__main__":
    sys.exit(main())

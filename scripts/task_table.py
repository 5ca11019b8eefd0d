"""The per-task table and plot: each leading method's overall speedup and MAT on every task and temperature.

    python scripts/task_table.py results/cpu-headline-v3 results/cpu-tasks \
        --readme README.md --plot results/cpu-tasks/plots

Reads every run directory under the given sweep folders, averages repeated runs (report/tables.aggregate)
and lays the tasks side by side (report/task_table.py; where a method ran both against a shared AR and with AR
interleaved, only the interleaved runs count; where several folders ran a method on a task at a temperature,
only the last folder's runs count: give the folders oldest first): a row per method among the leaders, a column per
(temperature, task), each cell 'speedup ± std (MAT, n=runs)', the column's best in bold. With --readme,
the block between `<!-- task-table: begin -->` and `<!-- task-table: end -->` gets the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.markdown import replace_between
from specbench.report import collect, plots, tables, task_table

BEGIN, END = "<!-- task-table: begin (scripts/task_table.py) -->", "<!-- task-table: end -->"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+", help="sweep folders (results roots)")
    ap.add_argument("--top", type=int, default=6, help="rows: every column's best, then the next by mean speedup")
    ap.add_argument("--readme", help="a Markdown file with the task-table markers")
    ap.add_argument("--plot", help="a folder for plots/speedup_by_task.png")
    args = ap.parse_args(argv)

    rows = [{**row, "root": i} for i, root in enumerate(args.roots)
            for row in collect.run_rows(collect.load_runs(root))]
    if not rows:
        print(f"error: no run directories under {', '.join(args.roots)}; give sweep folders (results roots)",
              file=sys.stderr)
        return 2
    aggregated = tables.aggregate(task_table.latest_root(task_table.interleaved_first(rows)))
    md = task_table.task_table(aggregated, args.top)
    note = ("Overall speedup over AR (mean ± std over runs), MAT and runs in brackets; the best of each column "
            f"in bold; {task_table.timing_marks.MARK}: not timed alone, or timed on another machine speed than its AR (its plain steps). From: " + ", ".join(f"`{r}`" for r in args.roots) + ".")
    print(md + "\n\n" + note)
    if args.readme:
        readme = Path(args.readme)
        text = readme.read_text()
        if BEGIN not in text or END not in text:
            print(f"error: {readme} lacks the lines '{BEGIN}' and '{END}'; add them where the table goes",
                  file=sys.stderr)
            return 2
        readme.write_text(replace_between(text, md + "\n\n" + note, BEGIN, END))
    if args.plot:
        by_label = task_table.cells(aggregated)
        cols = task_table.columns([r for r in aggregated if r["method"] != "ar"])
        chosen = task_table.leaders(by_label, cols, args.top)
        fig = plots.speedup_by_task(by_label, cols, chosen)
        print(f"written: {plots.save(fig, Path(args.plot), 'speedup_by_task', ('png',))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

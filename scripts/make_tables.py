"""Spec-Bench leaderboard tables from a results root, as Markdown, LaTeX and CSV.

    python scripts/make_tables.py results/                 # prints Markdown, writes results/tables.*
    python scripts/make_tables.py results/ --out paper/ --published results/published

One table per model / task / temperature / max_new_tokens / dtype / device, columns MT,
Translation, Summarization, QA, Math, RAG (speedups over AR), MAT, tokens/s, Overall (speedup over
all questions). A task with subtasks of its own has those columns instead, in the order its
questions give them (task=long: its input-length buckets 1k, 2k, 4k, 8k; in the CSVs speedup_1k, ...).
Every number is recomputed from answers.jsonl with Spec-Bench's definitions.
Repeated runs (repeat=0,1,2 -> directories <run>, <run>-r1, <run>-r2; any runs with the same
settings and method) are shown as mean ± sample std. Where the model is one of the published ones
(vicuna-7b/13b/33b v1.3) and decoding is greedy, the published rows (TR paper table and Spec-Bench
A100 board, results/published/) follow our rows, marked [source].

Where a method ran in several variants (scripts/tr_ablations.sh), an ablation table per method
follows: one row per variant (the settings that depart from the defaults), with MAT, speedup,
speedup bound and rows per step.

Also writes the sweep-level <root>/results.csv: one line per run directory.

A speedup not timed alone on one environment (a question timed under other load, a run with
timing.exclusive=false, or a method and its AR timed on different hardware or software:
report/timing_marks.py) is marked † with a footnote, and the script exits 1 unless --allow-mixed.

Serving runs under the root (run.py batch_size= / request_rate=, e.g.
`python run.py -m method=ar,tr,pld batch_size=1,4,16 batch_speculation=fixed,goodput repeat=0,1,2`)
get serving.md and plots/speedup_vs_batch.png, plots/latency_vs_rate.png in the same folder: one row
per configuration, its rounds (repeat=) combined as the mean of each round's own ratio to its AR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.report import collect, serving_report, tables

DEFAULT_PUBLISHED = Path(__file__).resolve().parents[1] / "results" / "published"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", default="results", help="results root (or one run directory)")
    ap.add_argument("--out", help="where tables.md/.tex/.csv go (default: the results root)")
    ap.add_argument("--published", default=str(DEFAULT_PUBLISHED),
                    help="directory of published CSVs ('' for none)")
    ap.add_argument("--no-results-csv", action="store_true", help="do not write <root>/results.csv")
    ap.add_argument("--allow-mixed", action="store_true",
                    help="exit 0 even when a speedup was not timed alone on one environment (it stays marked)")
    ap.add_argument("--readme", help="a Markdown file whose <!-- BEGIN TABLE: <root> --> ... <!-- END TABLE --> "
                                     "block gets the first table (the README's results table)")
    args = ap.parse_args(argv)

    root = Path(args.root)
    runs = collect.load_runs(root)
    serving = serving_report.combine(serving_report.load_serving(root))
    if not runs and not serving:
        print(f"no run directories (run_config.json + answers.jsonl, or a finished serving run) under {root}",
              file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else (root if root.is_dir() else root.parent)
    out.mkdir(parents=True, exist_ok=True)
    failed = serving_report.failures(serving)  # a serving configuration that fails the check: exit 1
    if serving:
        md = serving_report.serving_markdown(serving)
        (out / "serving.md").write_text(md)
        plots = serving_report.serving_plots(serving, out / "plots")
        print(md)
        print(f"written: {out / 'serving.md'}" + "".join(f", {p}" for p in plots), file=sys.stderr)
        for line in failed:
            print(f"LOSSLESS CHECK FAILED: {line}", file=sys.stderr)
        mixed_serving = [r for r in serving if r.get("timing_flags")]
        for r in mixed_serving:
            print(f"{'warning' if args.allow_mixed else 'error'}: serving {r['method']} B={r['batch_size']}: "
                  f"{'; '.join(r['timing_flags'])}; rerun it alone, or pass --allow-mixed to keep it, marked",
                  file=sys.stderr)
        if mixed_serving and not args.allow_mixed:
            failed = [*failed, "serving runs not timed alone"]
        if not runs:
            return 1 if failed else 0
    rows = collect.run_rows(runs)
    published = collect.load_published(args.published) if args.published and Path(args.published).is_dir() else []
    aggregated = tables.aggregate(rows)
    built = tables.build_tables(aggregated, published)
    md = tables.to_markdown(built)
    ablations = tables.ablation_markdown(tables.ablation_tables(aggregated))  # methods run in several variants
    if ablations:
        md += "\n" + ablations
    (out / "tables.md").write_text(md)
    (out / "tables.tex").write_text(tables.to_latex(built))
    (out / "tables.csv").write_text(tables.to_csv(built))
    if not args.no_results_csv:
        collect.write_results_csv(root, out / "results.csv")
    if args.readme:
        fill_readme_table(Path(args.readme), args.root, tables.to_markdown(built[:1]))
    print(md)
    print(f"written: {out / 'tables.md'}, {out / 'tables.tex'}, {out / 'tables.csv'}"
          + ("" if args.no_results_csv else f", {out / 'results.csv'}"), file=sys.stderr)
    mixed = [r for r in aggregated if r.get("timing_flags")]
    for r in mixed:
        print(f"{'warning' if args.allow_mixed else 'error'}: {r['method']} {tables.params_key(r.get('method_params'))} "
              f"({r['model']}, {r['task']}, T={r['temperature']:g}): {'; '.join(r['timing_flags'])}; "
              "rerun it alone (timing.exclusive=true), or pass --allow-mixed to keep it, marked", file=sys.stderr)
    return 1 if failed or (mixed and not args.allow_mixed) else 0


def fill_readme_table(readme: Path, root: str, table_md: str) -> None:
    """Replace the block between `<!-- BEGIN TABLE: {root} -->` and `<!-- END TABLE -->` with the table
    (its heading line dropped: the README's section names it)."""
    begin = f"<!-- BEGIN TABLE: {root.rstrip('/')} -->"
    text = readme.read_text()
    if begin not in text:
        raise SystemExit(f"error: {readme} has no '{begin}' line; add it and '<!-- END TABLE -->' around the table")
    body = "\n".join(line for line in table_md.strip().splitlines() if not line.startswith("#")).strip()
    head, rest = text.split(begin, 1)
    _, tail = rest.split("<!-- END TABLE -->", 1)
    readme.write_text(f"{head}{begin}\n{body}\n<!-- END TABLE -->{tail}")


if __name__ == "__main__":
    sys.exit(main())

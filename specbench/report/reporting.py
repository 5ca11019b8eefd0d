"""What follows a written run: the sweep-level results.csv and wandb logging (one request at a time),
the serving folder's table and plots (many at once).

Kept out of the run (run/single.py, run/serving.py) behind one call from main.py; a failure here prints a warning and never fails the run
(the answers and summary are already on disk).
"""

from __future__ import annotations

import sys
from pathlib import Path


def after_run(cfg: dict, summary: dict, records: list[dict], baseline: list[dict], out_dir: Path) -> None:
    root = Path(cfg["results_root"])
    try:  # results.csv gathers every run under results_root (runs written elsewhere: skipped)
        if Path(out_dir).resolve().is_relative_to(root.resolve()):
            from specbench.report.collect import write_results_csv
            write_results_csv(root)
    except Exception as e:  # noqa: BLE001 - reporting must not lose a finished run
        print(f"warning: could not write {root / 'results.csv'}: {e}", file=sys.stderr)
    try:
        from specbench.report.wandb_log import log_run
        log_run(cfg, summary, records, baseline, Path(out_dir))
    except Exception as e:  # noqa: BLE001
        print(f"warning: wandb logging failed: {e}", file=sys.stderr)


def after_serving_run(summary: dict) -> None:
    """This run's table printed; serving.md and plots/ beside it: every finished serving run in its
    folder, repeats combined (report/serving_report.py)."""
    folder = Path(summary["results_dir"]).parent
    try:
        from specbench.report import serving_report
        from specbench.run.results_io import write_text_atomic

        from specbench.report.console import timing_line

        print(serving_report.serving_table(serving_report.combine([summary])))
        warning = timing_line(summary.get("timing"))
        if warning:
            print(warning)
        combined = serving_report.combine(serving_report.load_serving(folder))
        write_text_atomic(folder / "serving.md", serving_report.serving_markdown(combined))
        serving_report.serving_plots(combined, folder / "plots")
    except Exception as e:  # noqa: BLE001 - reporting must not lose a finished run
        print(f"warning: could not write {folder / 'serving.md'}: {e}", file=sys.stderr)

"""What the runner does after a run is written: the sweep-level results.csv and wandb logging.

Kept out of runner.py behind one call; a failure here prints a warning and never fails the run
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

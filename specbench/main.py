"""The entry of every run: one request at a time (run/single.py) or many at once (run/serving.py), the
reports made after it (report/reporting.py: the sweep's results.csv, wandb), and the exit code."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from specbench.run import lossless
from specbench.run import schemas as _schemas  # noqa: F401  (registers the typed settings with Hydra)
from specbench.run.plan import plan_run, run_settings


def run_benchmark(given, hold_until_exit: bool = False) -> dict:
    """Run, write answers and summary, print the table. Returns the summary. `given`: the settings,
    Hydra's plain dict (run.py), one written by hand, or a config.RunConfig; typed, checked and
    resolved once here, into the plan the run reads (run/plan.py). To its last report the run holds its
    device's timing lock (run/timing_guard.py), so its untimed work never runs beside another run's
    timing; `hold_until_exit` (run.py's jobs): until the process ends, its teardown included (a second
    or two of CPU that would land in the next job's timing)."""
    from specbench.report.reporting import after_run, after_serving_run

    plan = plan_run(given)  # every setting checked before anything loads
    if plan.settings.is_serving:  # concurrent requests: run/serving.py
        from specbench.run.serving import run_serving

        summary, device = run_serving(plan)
        with _held_until_reported(device, hold_until_exit):
            after_serving_run(summary)  # prints this run's table, writes the folder's; warns, never fails
        return summary
    from specbench.report.console import print_finished
    from specbench.run.single import run_single

    done = run_single(plan)
    with _held_until_reported(done.device, hold_until_exit):
        print_finished(done.summary)
        after_run(done.plan.recorded(), done.summary, done.records, done.baseline, done.out_dir)  # warns, never fails
    return done.summary


@contextmanager
def _held_until_reported(device, hold_until_exit: bool):
    """The run's device lock, held shared while its reports are written (plots, wandb): released after
    them, or never (the kernel drops it as the process ends)."""
    try:
        yield
    finally:
        if not hold_until_exit:
            device.release()


def main_exit_code(summary: dict, given) -> int:
    """1 when the lossless check failed: a real mismatch with AR, a token outside the band, too large a
    share of numeric tokens (lossless.max_numeric_share), or fewer questions checked than asked.
    `given`: the run's settings, as run_benchmark takes them."""
    lo, lcfg = summary["lossless"], run_settings(given).lossless
    is_lossless = summary.get("lossless_method", True)
    asked, checked = lo.get("questions", lo.get("checked", 0)), lo.get("checked", 0)
    reasons = []
    if lo["mismatches"]:
        reasons.append(f"{lo['mismatches']} real mismatch(es) with AR")
    if is_lossless and lo.get("tokens_outside_band"):
        reasons.append(f"{lo['tokens_outside_band']} token(s) outside the rounding band of the target's choice")
    limit = lcfg.max_numeric_share
    if is_lossless and lossless.numeric_share_exceeded(lo, limit):
        reasons.append(f"{lo['tokens_numeric']} of {lo['tokens_checked']} tokens numeric "
                       f"({100 * lo['tokens_numeric'] / lo['tokens_checked']:.1f}%, more than lossless.max_numeric_share="
                       f"{limit:g}): a verifier that prefers the runner-up near a tie")
    if lcfg.check and checked < asked:
        reasons.append(f"only {checked} of {asked} questions checked (answers resumed from a run with "
                       "lossless.check=false?)")
    if reasons and lcfg.fail_on_mismatch:
        print("LOSSLESS CHECK FAILED: " + "; ".join(reasons), file=sys.stderr)
        return 1
    return 0

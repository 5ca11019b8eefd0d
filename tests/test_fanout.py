"""A sweep fanned out on one machine (`hydra/launcher=submitit_local`, two jobs at once, one AR
shared by both: issue 71's command) queues for timing on the device's lock: no timed section of one
job overlaps one of the other while the jobs themselves overlap, neither deadlocks on the shared AR's
file lock, and every token equals a serial sweep's (embedded SmolLM2-135M, 2 questions x 8 tokens
per method)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specbench.main import main_exit_code, run_benchmark
from tests.test_config import cfg

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("pld", "tr")
COMMON = ["task=mini", "task.limit=2", "max_new_tokens=8", "warmup=0", "compile=off", "cost_curve=off",
          "progress=false", "wandb.enabled=false", "baseline=shared"]


def _records(run: Path) -> list[dict]:
    """A run folder's answers, by question (the shared AR's are appended in whichever order the jobs
    asked for them)."""
    return sorted((json.loads(x) for x in (run / "answers.jsonl").read_text().splitlines()),
                  key=lambda r: str(r["question_id"]))


def _run_dir(root: Path, method: str) -> Path:
    return root / "smollm2-135m" / "mini-l2" / f"{method}-t0-m8"


def test_a_local_fan_out_queues_for_timing_and_matches_a_serial_sweep(tmp_path, real_model):
    env = dict(os.environ, SPECBENCH_LOCK_DIR=str(tmp_path / "locks"))  # the two jobs share one device lock
    fan = subprocess.run([sys.executable, "run.py", "-m", "hydra/launcher=submitit_local",
                          "hydra.launcher.timeout_min=20", f"hydra.sweep.dir={tmp_path}/multirun",
                          f"method={','.join(METHODS)}", *COMMON, f"results_root={tmp_path}/fan"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert fan.returncode == 0, fan.stderr[-3000:]
    for method in METHODS:  # the serial sweep, in this process on the model it holds
        c = cfg(f"method={method}", *COMMON, f"results_root={tmp_path}/serial")
        assert main_exit_code(run_benchmark(c), c) == 0

    waits, sections = {}, []
    for method in (*METHODS, "ar"):
        got, ref = _records(_run_dir(tmp_path / "fan", method)), _records(_run_dir(tmp_path / "serial", method))
        assert [r["question_id"] for r in got] == [r["question_id"] for r in ref]
        assert [[t["token_ids"] for t in r["turns"]] for r in got] == \
               [[t["token_ids"] for t in r["turns"]] for r in ref], method
        sections += [(r["timing"]["started"], r["timing"]["ended"]) for r in got]
    for method in METHODS:
        summary = json.loads((_run_dir(tmp_path / "fan", method) / "summary.json").read_text())
        assert summary["lossless"]["mismatches"] == 0 and summary["timing"]["exclusive"]
        waits[method] = summary["timing"]["waits"]
    # timed alone: no timed question (either job's, or the shared AR's) overlaps another
    sections.sort()
    for (_, end), (start, _) in zip(sections, sections[1:]):
        assert end <= start, sections
    # while the jobs ran at the same time: one waited for the other's loading or timing (they queued)
    assert sum(waits.values()) >= 1, waits

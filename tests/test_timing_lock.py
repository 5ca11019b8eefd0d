"""Timing that cannot be contaminated: the device's timing lock (run/device_lock.py), the load sampled
around a timed section (run/contention.py), the marks on a speedup not timed alone
(report/timing_marks.py), make_tables' exit code, and the door's refusal of a mixed shared baseline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from specbench.errors import SettingsError
from specbench.report import timing_marks
from specbench.run import metrics
from specbench.run import contention
from specbench.run.baselines import check_baseline_environment
from specbench.run.device_lock import DeviceLock, holders_text
from specbench.run.provenance import environment_key

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from specbench.run.device_lock import DeviceLock
lock = DeviceLock("cpu-test", "results/holder", sys.argv[2]).shared()
if sys.argv[3] == "timing":
    with lock.exclusive():
        print("held", flush=True)
        time.sleep(120)
if sys.argv[3] == "cycling":  # a run that checks and times in turn, as a run's questions do
    print("held", flush=True)
    for _ in range(600):
        with lock.exclusive():
            time.sleep(0.1)
        time.sleep(0.1)
print("held", flush=True)
time.sleep(120)
"""


def _holder(tmp_path: Path, state: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(ROOT), str(tmp_path), state],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _kill_later(proc: subprocess.Popen, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: os.kill(proc.pid, signal.SIGKILL))
    timer.start()
    return timer


def test_timing_waits_for_another_run_and_names_it_and_a_killed_holder_releases_the_lock(tmp_path, capsys):
    proc = _holder(tmp_path, "loading")  # another run loading or checking: timing must wait for it
    lock = DeviceLock("cpu-test", "results/me", tmp_path).shared()  # loading beside it is fine
    _kill_later(proc, 1.0)  # SIGKILL: no cleanup of its own, the kernel drops its lock
    start = time.perf_counter()
    with lock.exclusive():
        waited = time.perf_counter() - start
    lock.release()
    proc.wait(timeout=30)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("waiting for the timing lock of cpu-test"), err
    assert f"pid {proc.pid} " in err[0] and "(results/holder) loading or checking since" in err[0]
    assert waited >= 0.5 and lock.waits == 1 and lock.waited >= 0.5
    assert holders_text(tmp_path / "cpu-test.holders") == "held by a run that has not named itself"  # dead: dropped


def test_a_run_cannot_even_load_while_another_times(tmp_path):
    proc = _holder(tmp_path, "timing")
    _kill_later(proc, 1.0)
    start = time.perf_counter()
    lock = DeviceLock("cpu-test", "results/me", tmp_path).shared()
    assert time.perf_counter() - start >= 0.5  # it waited for the timing run to end (here: die)
    lock.release()
    proc.wait(timeout=30)


def test_a_run_that_times_and_checks_in_turn_lets_a_waiting_run_in(tmp_path):
    """flock alone would starve the waiting run: the other's conversions never leave the lock free."""
    proc = _holder(tmp_path, "cycling")
    try:
        lock = DeviceLock("cpu-test", "results/me", tmp_path).shared()
        for _ in range(3):
            start = time.perf_counter()
            with lock.exclusive():
                assert time.perf_counter() - start < 5.0
            time.sleep(0.05)
        lock.release()
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_runs_of_one_process_share_the_lock_and_other_devices_do_not_wait(tmp_path):
    a = DeviceLock("cpu-test", "results/a", tmp_path).shared()
    b = DeviceLock("cpu-test", "results/b", tmp_path).shared()  # a Hydra multirun's next job: the same process
    with a.exclusive():
        pass
    other = DeviceLock("cuda-GPU-1234", "results/c", tmp_path).shared()
    with other.exclusive():
        pass
    for lock in (a, b, other):
        lock.release()
    assert a.waits == b.waits == other.waits == 0


def test_cpu_load_counts_other_processes_beyond_the_free_cores():
    before = contention.CpuCounters(wall=0.0, busy=10.0, steal=0.0, own=1.0)
    after = contention.CpuCounters(wall=2.0, busy=14.0, steal=0.2, own=3.0)  # 4 busy core-s, 2 of them ours
    load = contention.cpu_load(before, after, cores=2, asked=1)
    assert load["own_cores"] == 1.0 and load["other_cores"] == 1.0 and load["steal_cores"] == 0.1
    assert load["free_cores"] == 1
    assert not contention.is_contended(load, 0.25)  # the other core was free: no contention
    assert contention.is_contended(dict(load, free_cores=0), 0.25)  # the run asked for both cores
    assert contention.is_contended(dict(load, steal_cores=0.5), 0.25)  # the hypervisor took time
    assert not contention.is_contended(dict(load, other_cores=None), 0.25)  # unknown: recorded, not flagged
    assert contention.is_contended({"gpu_other_processes": 1, "other_cores": 0.0, "free_cores": 1}, 0.25)


def test_the_sampler_flags_a_cpu_burner(tmp_path):
    cores = len(os.sched_getaffinity(0))
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.3)
        sampler = contention.LoadSampler("cpu", max_other_load=0.25)
        started = sampler.start()
        time.sleep(1.0)
        load = sampler.stop(started)
    finally:
        for b in burners:
            b.kill()
    assert load["contended"] and load["other_cores"] > cores - 1, load
    assert load["ended"] - load["started"] >= 1.0


def _record(qid, *, contended=False, exclusive=True, environment="e1"):
    return {"question_id": qid, "timing": {"contended": contended, "exclusive": exclusive,
                                           "environment": environment}}


def test_timing_flags_name_what_makes_a_speedup_untrustworthy():
    clean = [_record(1), _record(2)]
    assert timing_marks.timing_flags(clean, clean) == []
    assert timing_marks.timing_flags([{"question_id": 1}], [{"question_id": 1}]) == []  # older answers
    flags = timing_marks.timing_flags([_record(1, contended=True), _record(2)], [_record(1), _record(2, contended=True)])
    assert flags == ["2 timed question(s) under other load (method 1, AR 1)"]
    assert timing_marks.timing_flags([_record(1, exclusive=False)], clean) == [
        "timed on a shared device (timing.exclusive=false)"]
    assert timing_marks.timing_flags(clean, [_record(1, environment="e2"), _record(2)]) == [
        "method and AR timed on different hardware or software"]
    assert timing_marks.merged([["a"], ["b", "a"], []]) == ["a", "b"]



def _stepped(qid, ms: float, rows: int = 1, steps: int = 30, drafter_ms: float = 0.0, accepted: int = 1) -> dict:
    """A record whose one turn took `steps` steps of `rows` rows, each `ms` less the drafter's calls,
    each emitting `accepted` tokens, after a prompt of 100 tokens."""
    turn = {"input_tokens": 100, "step_rows": [rows] * steps, "step_times": [(ms + drafter_ms) / 1e3] * steps,
            "step_propose_times": [drafter_ms / 1e3] * steps, "step_observe_times": [0.0] * steps,
            "accept_lengths": [accepted] * steps}
    return dict(_record(qid), turns=[turn])


def test_a_method_timed_on_a_faster_machine_than_its_ar_is_flagged():
    """A plain step is AR's work at its context: plain steps clearly cheaper than AR's at the same
    contexts mean the machine drifted between the two runs."""
    ar = [_stepped(1, 32.0), _stepped(2, 32.0)]
    assert metrics.plain_steps([_stepped(1, 32.0, steps=3)]) == {(1, 0, 101): 32.0, (1, 0, 102): 32.0,
                                                                     (1, 0, 103): 32.0}
    # the drafter's own time is not the machine's: 25 ms of forward plus 3 of drafting is 25
    assert metrics.plain_step_ratio([_stepped(1, 25.0, drafter_ms=3.0)], ar) == (25.0 / 32.0, 30)
    assert metrics.plain_step_ratio([_stepped(1, 25.0, rows=4)], ar) == (None, 0)  # no plain step
    # steps that emit 3 tokens meet AR's at every third context only
    assert metrics.plain_step_ratio([_stepped(1, 32.0, accepted=3)], ar)[1] == 10
    flattered = timing_marks.timing_flags([_stepped(1, 25.6), _stepped(2, 25.6)], ar)
    assert flattered == ["its plain steps took 0.80x the time of AR's at the same contexts: the machine ran faster "
                         "for the method than for AR (compare with AR interleaved, or head to head)"]
    assert timing_marks.timing_flags([_stepped(1, 30.7), _stepped(2, 30.7)], ar) == []  # within 10%
    assert timing_marks.timing_flags([_stepped(1, 36.0), _stepped(2, 36.0)], ar) == []  # a method's own host work may slow it a little
    assert timing_marks.timing_flags([_stepped(1, 40.0), _stepped(2, 40.0)], ar) == [
        "its plain steps took 1.25x the time of AR's at the same contexts: the machine ran slower for the method "
        "than for AR (compare with AR interleaved, or head to head)"]
    assert timing_marks.timing_flags([_stepped(1, 20.0, steps=5)], ar) == []  # too few plain steps to tell


def test_the_run_says_in_one_line_when_its_ar_met_another_machine():
    from specbench.report.console import timing_line

    timing = {"exclusive": True, "contended": 0, "baseline_contended": 0}
    assert timing_line(dict(timing, plain_step_ratio={"ratio": 1.02, "steps": 80})) is None
    assert timing_line(dict(timing, plain_step_ratio={"ratio": None, "steps": 0})) is None  # nothing to compare
    line = timing_line(dict(timing, plain_step_ratio={"ratio": 0.84, "steps": 80}))
    assert line.startswith("TIMING NOT ALONE: its plain steps took 0.84x the time of AR's") and "faster" in line

def _write_run(root: Path, method: str, records: list[dict], base: list[dict]) -> None:
    run = root / "m" / "mini" / f"{method}-t0-m8"
    run.mkdir(parents=True)
    ident = {"model": "m", "task": "mini", "temperature": 0.0, "max_new_tokens": 8, "dtype": "float32",
             "device": "cpu"}
    (run / "run_config.json").write_text(json.dumps({"identity": ident, "config": {"method": {"name": method}}}))
    for name, recs in (("answers.jsonl", records), ("baseline_answers.jsonl", base)):
        (run / name).write_text("".join(json.dumps(r) + "\n" for r in recs))


def _answer(qid, wall: float, timing: dict | None = None) -> dict:
    turn = {"new_tokens": 8, "wall_time": wall, "prefill_time": 0.01, "accept_lengths": [1] * 8,
            "token_ids": [1] * 8, "output": "x"}
    return {"question_id": qid, "category": "qa", "subtask": "qa", "turns": [turn],
            "lossless": {"status": "exact"}, **({"timing": timing} if timing else {})}


@pytest.mark.parametrize("contended", [False, True])
def test_make_tables_marks_a_contended_speedup_and_exits_1_unless_allowed(tmp_path, contended, capsys):
    from scripts.make_tables import main

    load = {"contended": contended, "exclusive": True, "environment": "e1"}
    _write_run(tmp_path, "pld", [_answer(1, 0.5, load), _answer(2, 0.5, load)],
               [_answer(1, 1.0, dict(load, contended=False)), _answer(2, 1.0, dict(load, contended=False))])
    args = [str(tmp_path), "--published", ""]
    code, err = main(args), capsys.readouterr().err
    table = (tmp_path / "tables.md").read_text()
    if not contended:
        assert code == 0, err
        assert timing_marks.MARK not in table
        return
    assert code == 1 and "error: pld" in err and "--allow-mixed" in err
    assert f"| pld {timing_marks.MARK} |" in table and "2 timed question(s) under other load (method 2, AR 0)" in table
    assert main([*args, "--allow-mixed"]) == 0 and "warning: pld" in capsys.readouterr().err


def test_a_shared_baseline_timed_elsewhere_is_refused_at_the_door(tmp_path):
    here = {"cpu_model": "X", "cores": 2, "gpu_name": None, "torch": "2.13", "transformers": "5.24"}
    ar_dir = tmp_path / "ar-t0-m8"
    ar_dir.mkdir()
    check_baseline_environment("shared", ar_dir, here=here)  # nothing there yet: fine
    (ar_dir / "run_config.json").write_text(json.dumps({"identity": {}, "provenance": dict(here, cpu_model="Y")}))
    with pytest.raises(SettingsError, match=r"baseline=shared: the AR answers in .* were timed on other hardware or "
                                            r"software \(cpu_model 'Y' there, 'X' here\)"):
        check_baseline_environment("shared", ar_dir, here=here)
    (ar_dir / "run_config.json").write_text(json.dumps({"identity": {}, "provenance": here}))
    check_baseline_environment("shared", ar_dir, here=here)  # the same environment
    (ar_dir / "answers.jsonl").write_text(json.dumps({"question_id": 1, "timing": {"environment": "0000"}}) + "\n")
    with pytest.raises(SettingsError, match="timing environment"):  # one answer appended from elsewhere
        check_baseline_environment("shared", ar_dir, here=here)
    (ar_dir / "answers.jsonl").write_text(json.dumps({"question_id": 1, "timing": {"environment":
                                                                                  environment_key(here)}}) + "\n")
    check_baseline_environment("shared", ar_dir, here=here)


def test_a_serving_run_timed_under_load_is_marked_in_its_table():
    from specbench.report import serving_report

    base = {"method": "pld", "method_params": {}, "model": "m", "task": "mini", "dtype": "float32", "device": "cpu",
            "forward": "eager", "max_new_tokens": 8, "batch_size": 4, "request_rate": None,
            "batch_speculation": "fixed", "throughput": 10.0, "mat": 1.5, "rows_per_step": 4.0, "latency_mean": 1.0,
            "latency_p50": 1.0, "latency_p99": 1.0, "tpot_ms": 10.0, "speedup": 1.2,
            "lossless": {"checked": 4, "exact": 4}, "results_dir": "a"}
    clean = dict(base, timing={"exclusive": True, "contended": 0, "baseline_contended": 0})
    loaded = dict(base, results_dir="b", repeat=1, timing={"exclusive": True, "contended": 1, "baseline_contended": 0})
    assert timing_marks.summary_flags(clean) == []
    md = serving_report.serving_markdown(serving_report.combine([clean]))
    assert timing_marks.MARK not in md
    md = serving_report.serving_markdown(serving_report.combine([clean, loaded]))  # two rounds, one under load
    assert f"| pld {timing_marks.MARK} |" in md and "pld B=4: 1 timed side(s) under other load" in md

"""The cost curve: its file format, a real (quick) measurement on a tiny model (format only, never
timings), where runs find a curve, and the speedup bound on hand-made records."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench.speculation import cost
from specbench.speculation.cost import CostCurve, curve_for, measure_cost_curve, resolve_curve, run_bound

ROOT = Path(__file__).resolve().parents[1]
JSON_FIELDS = {"widths", "times_ms", "model", "device", "dtype", "context_len", "repeats", "quick", "created",
               "versions", "forward", "compile_seconds"}


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cost, "_QUICK_CURVES", {})
    return tmp_path / "cache"


def test_measured_curve_has_every_field_and_round_trips(tiny_llama, tmp_path):
    c = measure_cost_curve(tiny_llama, widths=[4, 2], context_len=16, repeats=2, warmup=1,
                           model_name="tiny", dtype_name="float32")
    assert c.widths == [1, 2, 4]  # w = 1, the plain step, is always measured
    assert len(c.times) == 3 and all(t > 0 for t in c.times)
    assert (c.model, c.dtype, c.context_len, c.repeats, c.quick) == ("tiny", "float32", 16, 2, False)
    assert c.device == cost.device_name("cpu") and "threads" in c.device
    data = c.to_json()
    assert set(data) == JSON_FIELDS and set(data["times_ms"]) == {"1", "2", "4"}
    assert set(data["versions"]) == {"torch", "transformers"}
    back = CostCurve.load(c.save(tmp_path / "sub" / "curve.json"))
    assert back.widths == c.widths and back.times == pytest.approx(c.times, abs=1e-6)
    assert (back.model, back.device, back.dtype, back.context_len) == (c.model, c.device, c.dtype, c.context_len)
    assert set(json.loads((tmp_path / "sub" / "curve.json").read_text())) == JSON_FIELDS


def test_interpolation_and_extrapolation():
    c = CostCurve(widths=[8, 1, 4], times=[0.2, 0.1, 0.1])
    assert c.widths == [1, 4, 8]
    assert c.t(1) == c.t(0) == 0.1
    assert c.t(6) == pytest.approx(0.15)
    assert c.t(12) == pytest.approx(0.3)  # the last segment extended
    assert c.table(3) == [0.1, 0.1, 0.1]
    with pytest.raises(ValueError, match="w = 1"):
        CostCurve(widths=[2], times=[0.1])


def test_runs_use_the_profiled_curve_else_a_quick_one_kept_in_memory(tiny_llama, empty_cache):
    quick = curve_for(tiny_llama, "tiny", "float32")
    assert quick.quick and quick.widths == list(cost.QUICK_WIDTHS)
    assert quick.roofline is not None and quick.floor(1) > 0  # the machine's figures come with it
    assert not (empty_cache / "cost").exists()  # a quick curve never becomes the cached one
    assert curve_for(tiny_llama, "tiny", "float32") is quick  # one measurement per process
    profiled = CostCurve(widths=[1, 2], times=[0.01, 0.02], model="tiny", device=cost.device_name("cpu"),
                         dtype="float32")
    profiled.save(cost.cache_path("tiny", profiled.device, "float32"))
    got = curve_for(tiny_llama, "tiny", "float32")
    assert not got.quick and got.times == [0.01, 0.02]
    assert curve_for(tiny_llama, "other", "float32", measure=False) is None


def test_resolve_curve_from_object_dict_file_or_model(tmp_path, tiny_llama, empty_cache):
    c = CostCurve(widths=[1, 8], times=[0.05, 0.1])
    assert resolve_curve(c) is c
    assert resolve_curve(c.to_json()).times == pytest.approx(c.times)
    assert resolve_curve(str(c.save(tmp_path / "c.json"))).widths == [1, 8]
    with pytest.raises(FileNotFoundError, match="profile_cost"):
        resolve_curve(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="cost curve is needed"):
        resolve_curve(None)
    assert resolve_curve("auto", tiny_llama, "tiny", "float32").quick


def record(rows, lengths):
    return {"question_id": "q", "turns": [{"step_rows": rows, "accept_lengths": lengths}]}


def test_bound_of_a_fixed_tree_is_mat_times_t1_over_t_rows():
    c = CostCurve(widths=[1, 81], times=[0.064, 0.311])
    b = run_bound(c, [record([81, 81], [3, 1]), record([81], [2])])
    assert b["bound"] == pytest.approx(2.0 * 0.064 / 0.311)
    assert b["bound_mean_rows"] == pytest.approx(b["bound"]) and b["mean_rows"] == 81
    assert b["cost_curve"]["t1_ms"] == pytest.approx(64.0)


def test_bound_of_varying_widths_sums_each_steps_time():
    c = CostCurve(widths=[1, 3, 5], times=[1.0, 1.0, 3.0])
    b = run_bound(c, [record([1, 5], [1, 3])])
    assert b["bound"] == pytest.approx(4 * 1.0 / (1.0 + 3.0))
    assert b["bound_mean_rows"] == pytest.approx(2.0 * 1.0 / 1.0)  # t(mean rows = 3) hides the cost
    assert run_bound(c, [record([1, 1, 1], [1, 1, 1])])["bound"] == pytest.approx(1.0)  # AR


def test_curve_is_fitted_non_decreasing_in_rows_and_saved_as_measured(tmp_path):
    """A dip (a wide forward timed quicker than a narrow one) is pooled away, so no width costs less
    than a narrower one; the file keeps the measured times."""
    assert cost.non_decreasing([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert cost.non_decreasing([2.0, 1.0, 3.0]) == [1.5, 1.5, 3.0]
    assert cost.non_decreasing([1.0, 2.0, 2.0]) == [1.0, 2.0, 2.0]  # rising already: kept
    c = CostCurve(widths=[1, 2, 11, 81], times=[0.030, 0.028, 0.027, 0.040],
                  contexts=[2048], context_times=[[0.05, 0.06, 0.04, 0.07]])
    ts = [c.t(w) for w in range(1, 82)]
    assert all(a <= b for a, b in zip(ts, ts[1:])) and c.t(1) == pytest.approx(0.085 / 3)
    assert all(c.t(w, 2048) <= c.t(w + 1, 2048) for w in range(1, 81))
    assert CostCurve.load(c.save(tmp_path / "c.json")).times == pytest.approx([0.030, 0.028, 0.027, 0.040])


def test_a_prediction_never_exceeds_the_mat_and_counts_the_drafters_host_time():
    """MAT x t(1) / (t(rows) + drafter host time): on a curve that once dipped below t(1) (PLD was
    predicted above its MAT) the prediction is at most the MAT; the drafter's time lowers it."""
    from specbench.speculation.predictions import predicted_speedup

    c = CostCurve(widths=[1, 11, 81], times=[0.0100, 0.0095, 0.0120])
    assert predicted_speedup(c, 1.75, 11) <= 1.75
    assert predicted_speedup(c, 2.0, 81, host_seconds=0.002) == pytest.approx(2.0 * c.t(1) / (0.012 + 0.002))
    turn = record([81, 81], [3, 1])["turns"][0]
    timed = {"question_id": "q", "turns": [turn | {"step_propose_times": [0.001, 0.003],
                                                  "step_observe_times": [0.0005, 0.0005]}]}
    b = run_bound(c, [timed], drafter_host=True)
    assert b["bound"] == pytest.approx(4 * c.t(1) / (2 * 0.012 + 0.005)) and b["drafter_host_ms"] == pytest.approx(2.5)
    assert run_bound(c, [timed])["bound"] == pytest.approx(4 * c.t(1) / (2 * 0.012))  # the summary's bound
    assert "drafter_host_ms" not in run_bound(c, [record([81], [2])], drafter_host=True)  # older answers


def test_no_bound_without_curve_or_rows():
    c = CostCurve(widths=[1], times=[1.0])
    assert run_bound(None, [record([1], [1])]) is None
    assert run_bound(c, [{"question_id": "q", "turns": [{"accept_lengths": [1]}]}]) is None
    assert run_bound(c, [record([], [])]) is None


def test_profiler_script_writes_the_curve(real_model, tmp_path):
    out = tmp_path / "curve.json"
    proc = subprocess.run([sys.executable, "scripts/profile_cost.py", "--widths", "2", "--repeats", "1",
                           "--warmup", "0", "--context", "8", "--out", str(out), "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert set(data) == JSON_FIELDS | {"roofline"} and set(data["times_ms"]) == {"1", "2"}
    assert data["model"] == "smollm2-135m" and data["dtype"] == "float32" and data["context_len"] == 8
    assert data["roofline"]["bandwidth"] > 0 and data["roofline"]["throughput"] > 0
    assert "w=1:" in proc.stdout and "t/floor" in proc.stdout

"""Named shapes with random weights and the speedups predicted on their cost curves: the shapes'
sizes (counted, never built at 7B here), a tiny stand-in profiled on the CPU, the prediction
arithmetic, trace replay against `cost.run_bound`, and scripts/shape_cost.py end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench.errors import SettingsError
from specbench.speculation import shapes
from specbench.speculation.cost import CostCurve, run_bound
from specbench.speculation.predictions import (greedy_runs, markdown_table, predicted_speedup, predictions, published_predictions, read_traces, trace_predictions)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "shape_cost.py"
NO_HYDRA = "import sys, runpy; sys.modules['hydra'] = None; sys.modules['omegaconf'] = None; "


def meta_parameter_count(name: str) -> int:
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(shapes.shape_config(name)).parameters())


def test_real_shapes_have_the_published_parameter_counts():
    assert shapes.parameter_count("smollm2-135m") == 134_515_008
    assert shapes.parameter_count("vicuna-7b") == 6_738_415_616  # LLaMA-7B
    assert shapes.parameter_count("vicuna-13b") == 13_015_864_320  # LLaMA-13B
    for name in shapes.SHAPES:  # the arithmetic is transformers' own count, on the meta device
        assert shapes.parameter_count(name) == meta_parameter_count(name), name


def test_each_real_shape_has_a_tiny_stand_in_of_its_family():
    assert set(shapes.STAND_INS) == set(shapes.REAL_SHAPES)
    for real, tiny in shapes.STAND_INS.items():
        r, t = shapes.SHAPES[real], shapes.SHAPES[tiny]
        assert shapes.real_shape(tiny) == real and shapes.real_shape(real) == real
        assert t["vocab_size"] == r["vocab_size"] and t["tie_word_embeddings"] == r["tie_word_embeddings"]
        assert t["hidden_size"] // t["num_attention_heads"] == r["hidden_size"] // r["num_attention_heads"]
        assert (t["num_attention_heads"] == t["num_key_value_heads"]) == (r["num_attention_heads"] == r["num_key_value_heads"])
        assert shapes.parameter_count(tiny) < 40e6
    with pytest.raises(SettingsError, match="valid shapes: smollm2-135m, vicuna-7b, vicuna-13b"):
        shapes.check_shape_name("vicuna-8b")


def test_tiny_stand_in_builds_and_profiles_on_the_cpu():
    model = shapes.random_model("tiny-7b", "cpu", torch.float32)
    assert not model.training and model.device.type == "cpu"
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in model.parameters())
    assert 0.015 < model.model.layers[0].mlp.up_proj.weight.std().item() < 0.025  # normal(0, 0.02)
    curve = shapes.measure_shape_curve(model, "tiny-7b", widths=(2, 4), context_len=16, repeats=1, warmup=1)
    assert curve.widths == [1, 2, 4] and curve.t(1) > 0
    assert curve.model == "tiny-7b (random weights)" and curve.forward == "eager"
    assert curve.roofline is not None and curve.floor(1) > 0


def test_a_compiled_engine_that_falls_back_gives_an_eager_curve(monkeypatch):
    from specbench.decoding import compiled

    class Failing:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("no compiler here")

    monkeypatch.setattr(compiled, "CompiledForward", Failing)
    model = shapes.random_model("tiny-135m", "cpu", torch.float32)
    curve = shapes.measure_shape_curve(model, "tiny-135m", widths=(2,), context_len=8, repeats=1, warmup=0,
                                       compiled=True)
    assert curve.forward == "eager" and curve.compile_seconds == 0.0


def test_random_model_builds_in_the_asked_dtype():
    model = shapes.random_model("tiny-135m", "cpu", torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as SmolLM2


def test_prediction_is_mat_times_t1_over_t_rows():
    curve = CostCurve(widths=[1, 8, 81], times=[0.020, 0.021, 0.026])
    assert predicted_speedup(curve, 2.7, 81) == 2.7 * 0.020 / 0.026
    rows = published_predictions(curve, "vicuna-7b", traces={})
    tr = {r["source"]: r for r in rows if r["method"] == "tr"}
    assert set(tr) == {"Spec-Bench A100 (vicuna-7b-v1.3)", "TR paper A100 (vicuna-7b-v1.3)"}
    paper = tr["TR paper A100 (vicuna-7b-v1.3)"]
    assert (paper["mat"], paper["mean_rows"], paper["published"]) == (2.70, 81, 2.03)
    assert paper["predicted"] == 2.70 * curve.t(1) / curve.t(81)
    pld = next(r for r in rows if r["method"] == "pld")  # rows not published, no trace given: no prediction
    assert pld["mean_rows"] is None and pld["predicted"] is None
    assert not published_predictions(curve, "smollm2-135m", traces={})  # no published figures for it
    assert {r["source"] for r in published_predictions(curve, "vicuna-13b", traces={})} == {"TR paper A100 (vicuna-13b-v1.3)"}


def synthetic_records(method: str) -> list[dict]:
    return [{"method": method, "turns": [{"step_rows": [1, 5, 9], "accept_lengths": [1, 3, 2]}]},
            {"method": method, "turns": [{"step_rows": [6], "accept_lengths": [4]}]}]


def test_trace_replay_equals_run_bound():
    curve = CostCurve(widths=[1, 4, 16], times=[0.010, 0.012, 0.020])
    records = synthetic_records("pld")
    [row] = trace_predictions(curve, {"pld": (records, "results/x/pld-t0-m8")})
    bound = run_bound(curve, records)
    assert row["predicted"] == bound["bound"] and row["mean_rows"] == bound["mean_rows"] == 21 / 4
    assert row["mat"] == 10 / 4 and row["published"] is None


def test_traces_come_from_greedy_runs_first_folder_first(tmp_path):
    def write(folder, run, method):
        d = tmp_path / folder / "m" / "task" / run
        d.mkdir(parents=True)
        (d / "answers.jsonl").write_text("\n".join(json.dumps(r) for r in synthetic_records(method)))

    write("a", "pld-t0-m8", "pld")
    write("a", "ar-t0-m8", "ar")
    write("a", "tr-t0.7-m8", "tr")  # sampled: left out
    write("b", "pld-t0-m8", "pld")
    write("b", "rest-t0-m8", "rest")
    traces = read_traces(("a", "b"), root=tmp_path)
    assert {m: run for m, (_, run) in traces.items()} == {"pld": "a/m/task/pld-t0-m8", "rest": "b/m/task/rest-t0-m8"}
    # the replay at another temperature takes that temperature's runs alone
    assert greedy_runs(("a", "b"), root=tmp_path, temperature="0.7") == [tmp_path / "a/m/task/tr-t0.7-m8"]
    curve = CostCurve(widths=[1, 81], times=[0.01, 0.02])
    rows = predictions(curve, "tiny-7b", folders=("a", "b"), root=tmp_path)  # tiny-7b rehearses vicuna-7b
    assert not any(r["source"].startswith("trace") and r["method"] == "ar" for r in rows)
    pld = next(r for r in rows if r["method"] == "pld" and r["source"].startswith("Spec-Bench"))
    assert pld["mean_rows"] == 21 / 4 and pld["rows_from"] == "harness run a/m/task/pld-t0-m8 (mean)"


def test_markdown_table_marks_what_is_missing():
    table = markdown_table([{"method": "hydra", "source": "s", "mat": 3.26, "mean_rows": None, "rows_from": "none",
                             "predicted": None, "published": 2.07}])
    assert table.splitlines()[0].startswith("| method | source | MAT |")
    assert table.splitlines()[2] == "| hydra | s | 3.26 | - | none | - | 2.07x |"


def test_script_on_the_tiny_shape_without_hydra(tmp_path):
    argv = [str(SCRIPT), "--shape", "tiny-7b", "--device", "cpu", "--dtype", "float32", "--widths", "1,8,81",
            "--repeats", "1", "--warmup", "1", "--context", "32", "--out", str(tmp_path)]
    code = NO_HYDRA + f"sys.argv = {argv!r}; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    curve = CostCurve.load(tmp_path / "cost_tiny-7b_eager.json")
    assert curve.model == "tiny-7b (random weights)" and curve.widths == [1, 8, 81] and curve.roofline is not None
    table = (tmp_path / "predictions_tiny-7b_eager.md").read_text()
    assert "| tr | TR paper A100 (vicuna-7b-v1.3) | 2.70 | 81.0 |" in table
    for line in ("t(1) = ", "t(81)/t(1) = ", "t(1)/floor(1) = ", "| tr | TR paper A100"):
        assert line in r.stdout


def test_script_refuses_an_unknown_shape_before_building():
    r = subprocess.run([sys.executable, str(SCRIPT), "--shape", "vicuna-8b", "--out", "unused"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and not r.stdout
    [error] = [line for line in r.stderr.splitlines() if "error:" in line]
    assert "vicuna-8b" in error and all(name in error for name in shapes.SHAPES)


def test_replay_traces_prices_each_run_step_by_step_on_another_curve(tmp_path, capsys):
    import json

    from scripts.replay_traces import main

    run = tmp_path / "m" / "t" / "tr_fused-t0-m8"
    run.mkdir(parents=True)
    turn = {"step_rows": [81, 1], "accept_lengths": [3, 1], "token_ids": [0, 0, 0, 0]}
    (run / "answers.jsonl").write_text(json.dumps({"method": "tr_fused", "turns": [turn]}) + "\n")
    (run / "summary.json").write_text(json.dumps({"method": "tr_fused", "mat": 2.0, "speedup": {"overall": 1.3},
                                                  "method_params": {"cost_curve": "flat.json"}}))
    other = tmp_path / "m" / "t" / "tr_fused-t0-m8~coupled=False"  # a setting of its own: a row of its own
    other.mkdir()
    (other / "answers.jsonl").write_text((run / "answers.jsonl").read_text())
    (other / "summary.json").write_text(json.dumps({"method": "tr_fused", "mat": 2.0, "method_params": {
        "cost_curve": "flat.json", "coupled": False, "name_of_a_removed_setting": 1}}))
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"model": "m", "device": "gpu", "dtype": "float16", "context_len": 400,
                                 "widths": [1, 81], "times_ms": {"1": 10.0, "81": 15.0}}))
    assert main([str(curve), "--traces", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # AR would take 4 plain steps (40 ms) for the 4 tokens; the run took 15 + 10 ms
    assert "t(1) = 10.00 ms, t(81)/t(1) = 1.50" in out
    assert "| tr_fused | - | this curve | 2.00 | 41.0 | 1.60x | 1.30x |" in out
    assert "| tr_fused | coupled=False | this curve | 2.00 | 41.0 | 1.60x | - |" in out

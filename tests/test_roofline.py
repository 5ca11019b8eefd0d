"""The roofline floor beside the cost curve: its math on hand-made numbers, the tiny model's bytes and
FLOPs from its config, the curve file with and without machine figures, and the summary's
`forward_vs_floor` (never real timings: the measuring functions are only checked to return sane
numbers on small buffers)."""

import json

import pytest
import torch

from specbench.speculation import roofline
from specbench.speculation.cost import CostCurve, measure_cost_curve
from specbench.speculation.roofline import Roofline, floor_time, flops, forward_flops, forward_vs_floor, weight_bytes

# 1 GB of weights at 10 GB/s: 0.1 s; 2 x 0.5 GFLOP per row + 1000 FLOP per row per key at 100 GFLOP/s
RL = Roofline(bandwidth=10e9, throughput=100e9, weight_bytes=1_000_000_000, linear_params=500_000_000,
              attn_per_key=1000, matmul_size=2048, dtype="float32")


def test_floor_math_by_hand():
    assert flops(10, 3, w=2, context=5) == 2 * 10 * 2 + 3 * 2 * (5 + 2) == 82
    assert floor_time(100, 10, 50, 1000) == 10.0  # memory: 100 B / 10 B/s beats 50 FLOP / 1000 FLOP/s
    assert floor_time(100, 10, 50_000, 1000) == 50.0  # compute
    # w = 1, context 1000: memory 0.1 s; compute (1e9 + 1000 x 1001) / 1e11 = 0.01001 s
    assert RL.flops(1, 1000) == 1e9 + 1000 * 1001
    assert RL.floor(1, 1000) == pytest.approx(0.1) and RL.limit(1, 1000) == "memory"
    # w = 100: compute 100 x (1e9 + 1000 x 1100) / 1e11 = 1.0011 s
    assert RL.floor(100, 1000) == pytest.approx(100 * (1e9 + 1000 * 1100) / 1e11)
    assert RL.limit(100, 1000) == "compute"
    # the ridge: 2 x 5e8 x w / 1e11 = 0.1 s at w = 10 (attention adds a little, so compute wins there)
    assert RL.limit(9, 0) == "memory" and RL.limit(11, 0) == "compute"


def tiny_by_hand(tied: bool):
    """SmolLM-style Llama of tests/conftest.py: vocab 97, hidden 32, MLP 64, 2 layers, 4 heads of 8,
    2 KV heads (K and V project to 16)."""
    per_layer_linear = 32 * 32 + 32 * 16 + 32 * 16 + 32 * 32 + 3 * 32 * 64  # q, k, v, o; gate, up, down
    linear = 2 * per_layer_linear + 97 * 32  # + lm_head (tied: the embedding, applied to every row)
    norms = 2 * 2 * 32 + 32
    embedding = 97 * 32
    read = 2 * per_layer_linear + norms + 97 * 32  # untied: lm_head read, the input table not
    return linear, read * 4, 4 * 2 * 4 * 8, (2 * per_layer_linear + norms + embedding * (1 if tied else 2)) * 4


def test_flops_and_bytes_of_the_tiny_model_by_hand(tiny_llama):
    linear, read, attn, all_bytes = tiny_by_hand(tied=False)
    assert linear == 21536 and attn == 256
    assert sum(p.numel() * p.element_size() for p in tiny_llama.parameters()) == all_bytes
    assert weight_bytes(tiny_llama) == read == all_bytes - 97 * 32 * 4  # the input table is not read
    assert forward_flops(tiny_llama, 1, 16) == 2 * linear + attn * 17
    assert forward_flops(tiny_llama, 5, 16) == 2 * linear * 5 + attn * 5 * 21
    assert roofline.model_figures(tiny_llama) == {"weight_bytes": read, "linear_params": linear,
                                                  "attn_per_key": attn}


def test_a_tied_embedding_is_read_once():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    linear, _, attn, all_bytes = tiny_by_hand(tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert weight_bytes(model) == all_bytes == (2 * 9216 + 160 + 97 * 32) * 4
    assert forward_flops(model, 3, 10) == 2 * linear * 3 + attn * 3 * 13  # the lm_head still multiplies


def test_curve_json_round_trip_with_and_without_machine_figures(tmp_path):
    plain = CostCurve(widths=[1, 81], times=[0.06, 0.3], context_len=400)
    assert plain.roofline is None and plain.floor(1) is None and "roofline" not in plain.to_json()
    back = CostCurve.load(plain.save(tmp_path / "plain.json"))
    assert back.roofline is None and back.times == pytest.approx(plain.times)

    full = CostCurve(widths=[1, 81], times=[0.06, 0.3], context_len=400, roofline=RL)
    data = json.loads(full.save(tmp_path / "full.json").read_text())
    assert data["roofline"] == {"bandwidth": 10e9, "throughput": 100e9, "weight_bytes": 1_000_000_000,
                                "linear_params": 500_000_000, "attn_per_key": 1000, "matmul_size": 2048,
                                "dtype": "float32"}
    back = CostCurve.load(tmp_path / "full.json")
    assert back.roofline == RL and back.floor(81) == pytest.approx(RL.floor(81, 400))
    assert CostCurve.from_json(full.to_json()).roofline == RL

    old = {"widths": [1, 2], "times": [0.1, 0.2], "model": "m"}  # a file from before the roofline
    assert CostCurve.from_json(old).roofline is None


def test_forward_vs_floor_from_the_curve():
    c = CostCurve(widths=[1, 81], times=[0.3, 2.0], context_len=1000, roofline=RL)
    f = forward_vs_floor(c, 81.0)
    assert f["t1_ms"] == 300.0 and f["floor1_ms"] == pytest.approx(100.0) and f["ratio_t1"] == pytest.approx(3.0)
    assert f["limit_t1"] == "memory" and f["limit_at_mean_rows"] == "compute"
    floor81 = 81 * (1e9 + 1000 * 1081) / 1e11
    assert f["ratio_at_mean_rows"] == pytest.approx(2.0 / floor81) and f["mean_rows"] == 81.0
    assert (f["bandwidth_gb_s"], f["matmul_gflop_s"], f["weight_mb"]) == (10.0, 100.0, 1000.0)
    assert forward_vs_floor(c)["ratio_at_mean_rows"] is None  # no rows: t(1) only
    assert forward_vs_floor(CostCurve(widths=[1], times=[0.1])) is None
    assert forward_vs_floor(None) is None


def record(rows, lengths, subtask="qa"):
    return {"question_id": "q", "subtask": subtask, "turns": [
        {"new_tokens": sum(lengths), "wall_time": 1.0, "prefill_time": 0.1, "step_rows": rows,
         "accept_lengths": lengths}]}


def test_summary_and_table_report_the_ratio_when_the_curve_has_machine_figures():
    from specbench.report.console import format_table
    from specbench.run.summary import summarize

    from tests.test_config import plan_of

    cfg = plan_of({"method": {"name": "tr"}, "model": {"name": "m"}, "task": {"name": "t"}, "dtype": "float32",
                   "max_new_tokens": 8, "warmup": 0}, device_name="cpu")
    recs, base = [record([81, 81], [3, 1])], [record([1, 1], [1, 1])]
    with_rl = CostCurve(widths=[1, 81], times=[0.3, 2.0], context_len=1000, roofline=RL)
    s = summarize(cfg, recs, base, [], with_rl)
    f = s["forward_vs_floor"]
    assert set(f) >= {"t1_ms", "floor1_ms", "ratio_t1", "mean_rows", "ratio_at_mean_rows"}
    assert f["ratio_t1"] == pytest.approx(3.0) and f["mean_rows"] == 81
    line = [ln for ln in format_table(s).splitlines() if ln.startswith("t(1)/floor")]
    assert line == [line[0]] and "t(1)/floor = 3.0" in line[0] and "at 81.0 rows t/floor = 2.5" in line[0]

    s = summarize(cfg, recs, base, [], CostCurve(widths=[1, 81], times=[0.3, 2.0]))  # older curve
    assert s["forward_vs_floor"] is None and "floor" not in format_table(s)
    assert summarize(cfg, recs, base, [], None)["forward_vs_floor"] is None


def test_measuring_functions_return_sane_figures_on_small_sizes():
    bw = roofline.measure_bandwidth("cpu", size_bytes=1 << 20, repeats=1, min_time=0)
    rate, n = roofline.measure_matmul("cpu", torch.float32, max_n=64, repeats=1, min_time=0)
    assert bw > 1e6 and rate > 1e6 and n == 64


def test_measured_curve_carries_the_machine_figures(tiny_llama, monkeypatch):
    monkeypatch.setattr(roofline, "_MACHINE", {})
    monkeypatch.setattr(roofline, "measure_bandwidth", lambda device: 2e10)
    monkeypatch.setattr(roofline, "measure_matmul", lambda device, dtype: (1e11, 2048))
    c = measure_cost_curve(tiny_llama, widths=[2], context_len=8, repeats=1, warmup=0, machine=True)
    linear, read, attn, _ = tiny_by_hand(tied=False)
    assert c.roofline == Roofline(2e10, 1e11, read, linear, attn, 2048, "float32")
    assert c.floor(2) == pytest.approx(max(read / 2e10, (2 * linear * 2 + attn * 2 * 10) / 1e11))
    monkeypatch.setattr(roofline, "measure_bandwidth", lambda device: 1 / 0)  # cached per device/dtype
    assert measure_cost_curve(tiny_llama, widths=[2], context_len=8, repeats=1, warmup=0,
                              machine=True).roofline.bandwidth == 2e10


def test_width_ratios_put_the_floor_ratio_beside_the_measured_one():
    # 1 GB at 10 GB/s = 0.1 s; a row costs 2 GFLOP at 100 GFLOP/s = 0.02 s: compute-bound past 5 rows
    rl = Roofline(bandwidth=10e9, throughput=100e9, weight_bytes=1_000_000_000, linear_params=1_000_000_000,
                  attn_per_key=0)
    c = CostCurve(widths=[1, 8, 16], times=[0.2, 0.3, 0.5], context_len=10, roofline=rl)
    r = roofline.width_ratios(c, (8, 16, 32))  # 32 was not measured: left out
    assert [x["w"] for x in r] == [8, 16]
    assert r[0]["t_ratio"] == pytest.approx(1.5) and r[0]["floor_ratio"] == pytest.approx(1.6)
    assert r[1]["t_ratio"] == pytest.approx(2.5) and r[1]["floor_ratio"] == pytest.approx(3.2)
    assert roofline.width_ratios(CostCurve(widths=[1, 8], times=[0.1, 0.2]))[0]["floor_ratio"] is None

"""The cost curve at more than one context: t(w, L) interpolated in both axes, the file format (older
one-context files load unchanged), the contexts a run asks for and their cache key, the bound at each
step's context, and adaptive TR / tr_fused choosing smaller trees where long-context rows are dear."""

import json
from pathlib import Path

import pytest
import torch

from specbench.draft import DecodeState
from specbench.methods.tr.adaptive import AdaptiveTokenRecycling
from specbench.methods.tr.fused import FusedTokenRecycling
from specbench.speculation import cost
from specbench.speculation.cost import (CostCurve, StepTimes, at_context, at_width, contexts_for, curve_for,
                                        measure_cost_curve, run_bound, step_contexts)

ROOT = Path(__file__).resolve().parents[1]
OLD_FILE = ROOT / "results" / "tr_calibration" / "cost_curve.json"  # committed before curves had contexts


def two_contexts() -> CostCurve:
    """Rows cost little after 400 tokens and much after 4096 (t(1) grows too, less)."""
    return CostCurve(widths=[1, 5], times=[1.0, 1.4], context_len=400,
                     contexts=[4096], context_times=[[2.0, 6.0]])


def test_interpolation_in_width_and_context():
    c = two_contexts()
    assert c.t(5) == c.t(5, None) == 1.4  # no context: the curve's own, as one-context curves
    assert c.t(3, 400) == pytest.approx(1.2)  # in w
    assert c.t(5, 4096) == 6.0
    mid = (400 + 4096) / 2
    assert c.t(1, mid) == pytest.approx(1.5) and c.t(5, mid) == pytest.approx(3.7)  # in L
    assert c.t(3, mid) == pytest.approx((c.t(1, mid) + c.t(5, mid)) / 2)  # in both
    assert c.t(5, 100) == 1.4  # below the shortest context: its time
    assert c.t(5, 4096 + 3696) == pytest.approx(6.0 + 4.6)  # past the longest: the last segment extended
    assert c.t(9, 4096) == pytest.approx(10.0)  # past the widest: the last width segment extended
    assert c.table(3, mid) == pytest.approx([1.5, 2.05, 2.6])


def test_pure_interpolators():
    assert at_width([1, 4], [1.0, 2.5], 2) == pytest.approx(1.5)
    assert at_width([1], [2.0], 9) == 2.0
    assert at_context([400], [3.0], 8000) == 3.0
    assert at_context([400, 1000], [1.0, 2.0], 700) == pytest.approx(1.5)
    # a noisy last segment that falls must not make longer contexts cheaper than the longest measured
    assert at_context([400, 1000, 2000], [1.0, 2.2, 2.0], 4000) == 2.0


def test_one_context_curve_ignores_the_context():
    c = CostCurve(widths=[1, 8], times=[0.05, 0.1], context_len=400)
    assert c.t(8, 7600) == c.t(8) and c.table(8, 7600) == c.table(8)
    assert c.speedup_bound(2.0, 8, 7600) == c.speedup_bound(2.0, 8)


def test_json_round_trip_with_contexts(tmp_path):
    c = CostCurve(widths=[4, 1], times=[0.2, 0.1], context_len=400, contexts=[4096, 1024],
                  context_times=[[0.9, 0.3], [0.3, 0.12]])
    assert c.widths == [1, 4] and c.contexts == [1024, 4096]  # rows follow widths and contexts sorted
    assert c.context_times == [[0.12, 0.3], [0.3, 0.9]]
    data = json.loads(c.save(tmp_path / "c.json").read_text())
    assert data["context_times_ms"] == {"1024": {"1": 120.0, "4": 300.0}, "4096": {"1": 300.0, "4": 900.0}}
    assert "contexts" not in data and "context_times" not in data
    back = CostCurve.load(tmp_path / "c.json")
    assert back.contexts == c.contexts and back.context_times == [pytest.approx(r) for r in c.context_times]
    assert back.t(3, 2000) == pytest.approx(c.t(3, 2000))
    assert CostCurve.from_json({"widths": [1], "times": [0.1], "contexts": [800], "context_times": [[0.2]]}).t(1, 800) == 0.2


def test_old_one_context_file_loads_unchanged():
    raw = json.loads(OLD_FILE.read_text())
    c = CostCurve.load(OLD_FILE)
    assert c.contexts == [] and c.t(81, 7600) == c.t(81)
    data = c.to_json()
    assert "context_times_ms" not in data and data["times_ms"] == raw["times_ms"]


def test_inconsistent_contexts_are_refused():
    with pytest.raises(ValueError, match="every context"):
        CostCurve(widths=[1, 2], times=[1, 2], contexts=[800], context_times=[[1.0]])
    with pytest.raises(ValueError, match="differ"):
        CostCurve(widths=[1], times=[1], context_len=400, contexts=[400], context_times=[[1.0]])


def test_contexts_for_doubles_up_to_the_longest_context():
    assert contexts_for(100, 128) == (400,)  # never past the short context
    assert contexts_for(300, 256) == (400,)  # within LONG_CONTEXT: priced at the short one
    assert contexts_for(900, 256) == (400, 1024, 2048)
    assert contexts_for(1300, 1024) == (400, 1024, 2048, 4096)
    assert contexts_for(7500, 64, window=8192) == (400, 1024, 2048, 4096, 8192 - cost.ROWS_ROOM)
    assert contexts_for(100, 64, window=256) == (400,)


def test_cache_key_holds_the_contexts(tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(cost, "_QUICK_CURVES", {})
    short = cost.cache_path("m", "d", "float32")
    assert cost.cache_path("m", "d", "float32", contexts=(400,)) == short  # the short context alone
    long = cost.cache_path("m", "d", "float32", contexts=(4096, 400, 1024))
    assert long != short and long.name.endswith("__ctx1024-4096.json")
    dev = cost.device_name("cpu")
    CostCurve(widths=[1, 2], times=[0.01, 0.02], model="tiny", device=dev, dtype="float32").save(
        cost.cache_path("tiny", dev, "float32"))
    assert curve_for(tiny_llama, "tiny", "float32", measure=False) is not None
    assert curve_for(tiny_llama, "tiny", "float32", measure=False, contexts=(400, 1024)) is None  # not for a long task


def test_measured_at_two_contexts(tiny_llama):
    c = measure_cost_curve(tiny_llama, widths=[2], context_len=16, repeats=1, warmup=0, contexts=[16, 48])
    assert c.widths == [1, 2] and c.context_len == 16 and c.contexts == [48]
    assert len(c.context_times) == 1 and all(t > 0 for t in c.context_times[0])


def test_step_times_one_table_per_bucket():
    flat = StepTimes(CostCurve(widths=[1, 4], times=[1.0, 1.0]), 4)
    assert flat.key(7000) is None and flat.at(7000) is flat.at(None)
    times = StepTimes(two_contexts(), 5)
    assert times.key(4000) == times.key(4100) == 4096  # rounded to CONTEXT_BUCKET
    assert times.at(4000) is times.at(4100) and times.at(4000) == two_contexts().table(5, times.key(4000))
    assert times.at(None) == two_contexts().table(5)


def record(prompt, rows, lengths, **turn):
    return {"question_id": "q", "turns": [dict(prompt, step_rows=rows, accept_lengths=lengths, **turn)]}


def test_bound_at_each_steps_context():
    c = CostCurve(widths=[1, 5], times=[1.0, 1.0], context_len=400, contexts=[4096], context_times=[[1.0, 3.0]])
    # two steps of 5 rows: at 400 cached tokens (free rows), then at 400 + 3 (still nearly free)
    short = run_bound(c, [record({"input_tokens": 400}, [5, 5], [3, 2])])
    assert short["bound"] == pytest.approx(5 / (1.0 + c.t(5, 403)))
    # the same steps after a 4096-token prompt: each of the 5 rows costs three plain steps
    long = run_bound(c, [record({"prompt_ids": list(range(4096))}, [5, 5], [3, 2])])
    assert long["bound"] == pytest.approx(5 / (3.0 + c.t(5, 4099)))
    assert long["mean_context"] == pytest.approx(4097.5) and long["cost_curve"]["contexts"] == [400, 4096]
    assert long["bound_mean_rows"] == pytest.approx(2.5 * 1.0 / c.t(5, 4097.5))
    # a turn that does not say its prompt: every step at the curve's own context
    mixed = run_bound(c, [record({"input_tokens": 4096}, [5], [3]), record({}, [5], [2])])
    assert mixed["bound"] == pytest.approx(5 / 2.0) and mixed["mean_context"] is None


def test_step_contexts_count_what_earlier_steps_emitted():
    assert step_contexts(10, [1, 3, 2]) == [10, 11, 14]


# ---- the drafters ------------------------------------------------------------------------------

def steep_at_long_context(rows: int) -> CostCurve:
    """Rows free after 400 cached tokens; after 4096 each row costs a plain step."""
    return CostCurve(widths=list(range(1, rows + 1)), times=[0.064] * rows, context_len=400,
                     contexts=[4096], context_times=[[0.064 * w for w in range(1, rows + 1)]])


def state(length: int) -> DecodeState:
    return DecodeState(tokens=torch.full((length,), 4), prompt_len=length, step=0)


def test_adaptive_drafts_a_smaller_tree_at_long_context():
    d = AdaptiveTokenRecycling(vocab_size=10, k=2, tree=[[2], [2, 1]], cost_curve=steep_at_long_context(6),
                               confidence=False)
    assert d.propose(state(300)).tree.parents == (0, 0, 1, 1, 2)  # the prior alone pays where rows are free
    assert d.propose(state(5000)) is None  # where rows cost a step each, nothing does
    assert d.propose(state(301)).tree.parents == (0, 0, 1, 1, 2)  # back at a short context


def test_fused_drafts_a_smaller_tree_at_long_context():
    d = FusedTokenRecycling(vocab_size=10, k=2, tree=[[2], [2, 1]], cost_curve=steep_at_long_context(12),
                            confidence=False, retrieval="none")
    assert d.propose(state(300)).tree.parents == (0, 0, 1, 1, 2)
    assert d.propose(state(5000)) is None


def test_profiler_prints_t_per_context():
    import importlib.util

    from specbench.speculation.roofline import Roofline

    spec = importlib.util.spec_from_file_location("profile_cost", ROOT / "scripts" / "profile_cost.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    c = two_contexts()
    c.roofline = Roofline(bandwidth=1e9, throughput=1e9, weight_bytes=1e6, linear_params=1e3, attn_per_key=10)
    lines = script.context_table(c).splitlines()
    assert lines[0].split()[:3] == ["context", "w=1", "w=5"]
    assert lines[1].split()[:4] == ["400", "1000.0", "1400.0", "1.40"] and lines[2].split()[3] == "3.00"

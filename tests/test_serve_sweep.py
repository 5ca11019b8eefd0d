"""scripts/serve_sweep.py's summary: repeated rounds become one row per configuration, its speedup the
mean of each round's ratio to the same round's AR."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "serve_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("serve_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def line(method, policy, batch, round_, throughput, latency=10.0, load="closed", rate=None):
    return {"load": load, "method": method, "policy": policy, "batch": batch, "rate": rate, "round": round_,
            "throughput": throughput, "mat": 1.5, "rows_per_step": 4.0, "latency_mean": latency,
            "latency_p50": latency, "latency_p99": latency, "tpot_ms": 50.0, "exact_vs_ar": 12, "requests": 12,
            "tokens_outside_band": 0}


def test_rounds_are_paired_with_their_own_ar(sweep):
    # the machine ran 20% slower in round 2: each round's ratio is 1.10, the throughputs' ratio would not be
    rows = [line("ar", "fixed", 4, 1, 20.0), line("pld", "goodput", 4, 1, 22.0),
            line("ar", "fixed", 4, 2, 16.0), line("pld", "goodput", 4, 2, 17.6), line("pld", "fixed", 4, 1, 10.0)]
    combined = {(r["method"], r["policy"]): r for r in sweep.combine(rows, "closed")}
    good = combined["pld", "goodput"]
    assert good["rounds"] == 2 and good["speedup"] == pytest.approx(1.10) and good["throughput"] == pytest.approx(19.8)
    assert good["low"] == pytest.approx(1.10) and good["exact_vs_ar"] == 24
    assert combined["pld", "fixed"]["speedup"] == pytest.approx(0.5) and combined["pld", "fixed"]["rounds"] == 1
    table = sweep.tables(rows)
    assert "| pld | goodput | 4 | 2 | 19.8 | 1.10x (1.10-1.10) | 1.10-1.10 |" in table and "24/24 exact, 0 outside" in table


def test_the_interval_says_when_rounds_cannot_tell_a_method_from_ar(sweep, tmp_path):
    # ratios 0.95, 1.05, 0.97, 1.03: mean 1.00, and four rounds this spread leave 1 well inside the interval
    rows = [line("ar", "fixed", 16, k, 40.0) for k in (1, 2, 3, 4)]
    rows += [line("tr", "goodput", 16, k, 40.0 * q) for k, q in zip((1, 2, 3, 4), (0.95, 1.05, 0.97, 1.03))]
    (tr,) = [r for r in sweep.combine(rows, "closed") if r["method"] == "tr"]
    low, high = tr["ci95"]
    assert low < 1.0 < high and high - low == pytest.approx(3.182 * 0.047610, rel=1e-3)  # 2 t s / sqrt(4)
    # --report-only rewrites the tables and plots from results.jsonl alone (no model, no questions)
    (tmp_path / "results.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    sweep.main(["--out", str(tmp_path), "--report-only"])
    assert f"| {low:.2f}-{high:.2f} |" in (tmp_path / "tables.md").read_text()
    assert (tmp_path / "plots" / "speedup_vs_batch.png").is_file()


def test_under_arrivals_the_speedup_is_in_latency(sweep):
    rows = [line("ar", "fixed", 16, 1, 30.0, latency=20.0, load="poisson", rate=1.0),
            line("pld", "goodput", 16, 1, 31.0, latency=16.0, load="poisson", rate=1.0)]
    (pld,) = [r for r in sweep.combine(rows, "poisson") if r["method"] == "pld"]
    assert pld["speedup"] == pytest.approx(1.25)


def test_old_lines_without_a_round_count_as_round_one(sweep, tmp_path):
    rows = [line("ar", "fixed", 1, 1, 10.0), line("tr", "goodput", 1, 1, 12.0)]
    for r in rows:
        del r["round"]
    (tr,) = [r for r in sweep.combine(rows, "closed") if r["method"] == "tr"]
    assert tr["speedup"] == pytest.approx(1.2)
    sweep.plots(rows, tmp_path)
    assert (tmp_path / "speedup_vs_batch.png").stat().st_size > 0


def test_every_other_round_runs_a_batch_size_in_reverse(sweep):
    configs = [("single", "ar", "fixed", 1, None), ("closed", "ar", "fixed", 1, None), ("closed", "tr", "goodput", 1, None),
               ("closed", "ar", "fixed", 4, None), ("closed", "tr", "goodput", 4, None)]
    order = [(k, c[1], c[3]) for k, *c in sweep.schedule(configs, 3)]
    assert order == [(1, "ar", 1), (1, "ar", 1), (1, "tr", 1), (1, "ar", 4), (1, "tr", 4),
                     (2, "tr", 1), (2, "ar", 1), (2, "tr", 4), (2, "ar", 4),
                     (3, "ar", 1), (3, "tr", 1), (3, "ar", 4), (3, "tr", 4)]


def test_rounds_added_later_leave_the_earlier_rounds_alone(sweep):
    # a configuration added to a three-round sweep runs in the new rounds only, beside their own AR
    configs = [("single", "ar", "fixed", 1, None), ("closed", "ar", "fixed", 1, None), ("closed", "tr", "fixed", 1, None)]
    order = [(k, c[0], c[1]) for k, *c in sweep.schedule(configs, 5, first=4)]
    assert order == [(4, "closed", "tr"), (4, "closed", "ar"), (5, "closed", "ar"), (5, "closed", "tr")]

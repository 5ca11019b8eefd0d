"""Serving runs gathered into one table and two plots (report/serving_report.py, make_tables.py): repeated
runs of one configuration become one row, its speedup the mean of each run's own ratio to its AR."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from specbench.report import serving_report

ROOT = Path(__file__).resolve().parents[1]


def summary(method, batch, throughput, base, repeat=0, rate=None, latency=10.0, base_latency=10.0,
            speculation="fixed", params=None, **lossless):
    lo = {"questions": 12, "checked": 12, "exact": 12, "numeric_ties": 0, "mismatches": 0, "lossy_differences": 0,
          "tokens_checked": 600, "tokens_outside_band": 0, **lossless}
    return {"method": method, "method_params": params or {}, "model": "smollm2-135m", "task": "spec_bench",
            "dtype": "float32", "device": "cpu", "forward": "eager", "max_new_tokens": 128,
            "batch_size": batch, "request_rate": rate, "batch_speculation": speculation, "repeat": repeat,
            "throughput": throughput, "mat": 1.5, "rows_per_step": 4.0, "latency_mean": latency,
            "latency_p50": latency, "latency_p99": latency, "tpot_ms": 50.0,
            "baseline_throughput": None if method == "ar" else base,
            "speedup": None if method == "ar" else round(throughput / base, 3),
            "latency_speedup": None if method == "ar" else round(base_latency / latency, 3),
            "lossless": lo}


def write(root: Path, s: dict) -> Path:
    name = f"{s['method']}-b{s['batch_size']}" + (f"-rps{s['request_rate']:g}" if s["request_rate"] else "") \
        + f"-{s['batch_speculation']}" + (f"-r{s['repeat']}" if s["repeat"] else "") \
        + ("".join(f"~{k}={v}" for k, v in s["method_params"].items()))
    d = root / "smollm2-135m" / "spec_bench" / "serving" / name
    d.mkdir(parents=True)
    (d / "serving_config.json").write_text("{}")
    (d / "summary.json").write_text(json.dumps(s))
    return d


def test_rounds_are_each_paired_with_their_own_ar(tmp_path):
    # the machine ran 20% slower in round 2: each round's ratio is 1.10, the throughputs' ratio would not be
    for s in (summary("pld", 4, 22.0, 20.0, speculation="goodput"), summary("pld", 4, 17.6, 16.0, 1, speculation="goodput"),
              summary("pld", 4, 10.0, 20.0), summary("ar", 4, 20.0, None)):
        write(tmp_path, s)
    combined = {(r["method"], r["speculation"]): r for r in serving_report.combine(serving_report.load_serving(tmp_path))}
    good = combined["pld", "goodput"]
    assert good["rounds"] == 2 and good["speedup"] == pytest.approx(1.10) and good["throughput"] == pytest.approx(19.8)
    assert good["low"] == pytest.approx(1.10) and good["lossless"]["exact"] == 24
    assert combined["pld", "fixed"]["speedup"] == pytest.approx(0.5) and combined["pld", "fixed"]["rounds"] == 1
    assert combined["ar", "fixed"]["speedup"] is None
    table = serving_report.serving_markdown(list(combined.values()))
    assert "| pld | goodput | 4 | - | 2 | 19.8 | 1.10x (1.10-1.10) | 1.10-1.10 |" in table
    assert "24/24 valid, 24 exact vs AR" in table


def test_the_interval_says_when_rounds_cannot_tell_a_method_from_ar(tmp_path):
    # ratios 0.95, 1.05, 0.97, 1.03: mean 1.00, and four rounds this spread leave 1 well inside the interval
    for k, q in enumerate((0.95, 1.05, 0.97, 1.03)):
        write(tmp_path, summary("tr", 16, 40.0 * q, 40.0, repeat=k, speculation="goodput"))
    (tr,) = serving_report.combine(serving_report.load_serving(tmp_path))
    low, high = tr["ci95"]
    assert low < 1.0 < high and high - low == pytest.approx(3.182 * 0.047610, rel=1e-3)  # 2 t s / sqrt(4)
    plots = serving_report.serving_plots([tr], tmp_path / "plots")
    assert [p.name for p in plots] == ["speedup_vs_batch.png"] and plots[0].stat().st_size > 0


def test_under_arrivals_the_speedup_is_in_latency(tmp_path):
    write(tmp_path, summary("pld", 16, 31.0, 30.0, rate=1.0, latency=16.0, base_latency=20.0))
    (pld,) = serving_report.combine(serving_report.load_serving(tmp_path))
    assert pld["speedup"] == pytest.approx(1.25) and pld["request_rate"] == 1.0
    assert [p.name for p in serving_report.serving_plots([pld], tmp_path / "plots")] == ["latency_vs_rate.png"]


def test_variants_of_one_method_are_named_by_the_settings_that_differ(tmp_path):
    write(tmp_path, summary("tr_fused", 2, 12.0, 10.0, params={"retrieval": "pld", "matrix": True}))
    write(tmp_path, summary("tr_fused", 2, 13.0, 10.0, params={"retrieval": "suffix", "matrix": True}))
    names = sorted(r["method"] for r in serving_report.combine(serving_report.load_serving(tmp_path)))
    assert names == ["tr_fused (retrieval=pld)", "tr_fused (retrieval=suffix)"]


def test_make_tables_reports_serving_runs_and_fails_on_a_mismatch(tmp_path, capsys):
    main = runpy.run_path(str(ROOT / "scripts" / "make_tables.py"))["main"]
    write(tmp_path, summary("ar", 2, 10.0, None))
    write(tmp_path, summary("tr", 2, 12.0, 10.0))
    assert main([str(tmp_path), "--published", ""]) == 0
    assert "| tr | fixed | 2 | - | 1 | 12.0 | 1.20x |" in (tmp_path / "serving.md").read_text()
    assert (tmp_path / "plots" / "speedup_vs_batch.png").is_file()
    write(tmp_path, summary("tr", 2, 12.0, 10.0, repeat=1, exact=11, mismatches=1))  # a second round, one bug
    assert main([str(tmp_path), "--published", ""]) == 1
    err = capsys.readouterr().err
    assert "LOSSLESS CHECK FAILED: tr fixed B=2 rate=None: 23/24 valid" in err

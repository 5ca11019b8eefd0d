"""run.py's serving runs (`batch_size=` > 1, `request_rate=`): batched AR and the method side by side,
every request checked against its batch-size-1 AR output, a rerun resumes, and the serving metrics."""

import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.main import main_exit_code, run_benchmark
from specbench.run.serving_metrics import poisson_arrivals, serving_figures
from specbench.decoding.batched import BatchResult, BatchStep, DrafterPool, RequestRecord
from specbench.drafter import Drafter, LearnsAcrossRequests
from tests.test_config import CONF


def serving_cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return OmegaConf.to_container(compose("config", overrides=[
            "task.limit=3", "max_new_tokens=24", "warmup=1", f"results_root={tmp_path}", "progress=false",
            "cost_curve=off", *overrides]), resolve=True)


def test_arrivals():
    assert poisson_arrivals(3, None, 0) == [0.0, 0.0, 0.0]
    a = poisson_arrivals(2000, 4.0, 1)
    assert a[0] == 0.0 and a == sorted(a) and a == poisson_arrivals(2000, 4.0, 1)  # seeded
    assert (a[-1] - a[0]) / (len(a) - 1) == pytest.approx(0.25, rel=0.1)  # mean gap 1 / rate


def test_serving_figures_from_a_batch_result():
    recs = [RequestRecord(tokens=[1, 2, 3], accept_lengths=[1, 2], arrival=0.0, first_token=0.5, finished=1.5),
            RequestRecord(tokens=[4], accept_lengths=[], arrival=1.0, first_token=2.0, finished=2.0)]
    fig = serving_figures(BatchResult(recs, [BatchStep(rows=4, real_rows=3, active=2, time=0.1),
                                             BatchStep(rows=2, real_rows=2, active=1, time=0.1)], wall_time=2.0))
    assert fig["throughput"] == 2.0 and fig["tokens"] == 4  # 4 tokens in 2 s
    assert fig["latency_mean"] == 1.25 and fig["latency_p50"] == 1.25  # 1.5 and 1.0
    assert fig["tpot_ms"] == 500.0  # only the request with more than one token: 1 s over 2 tokens
    assert fig["mat"] == 1.5 and fig["rows_per_step"] == 3.0


def test_a_drafter_pool_reuses_finished_drafters_and_shares_learned_state():
    built = []

    class Counting(Drafter, LearnsAcrossRequests):
        name = "counting"

        def __init__(self):
            self.starts, self.shared = 0, None
            built.append(self)

        def start_question(self):
            self.starts += 1

        def share_learned_state(self, other):
            self.shared = other

    pool = DrafterPool(Counting)
    a, b = pool(), pool()
    assert a is not b and b.shared is a and len(built) == 2
    pool.release(a)
    assert pool() is a and a.starts == 1 and len(built) == 2  # a finished request's drafter serves the next


def test_serving_true_makes_batch_size_one_a_serving_run(tmp_path):
    """A batch-size sweep's first point decodes on the batched engine, not the single-request one."""
    from specbench.run.plan import run_settings
    from specbench.run.plan import serving_dir

    assert not run_settings(serving_cfg(tmp_path, "method=pld")).is_serving
    c = run_settings(serving_cfg(tmp_path, "method=pld", "serving=true"))
    assert c.is_serving and serving_dir(c).name == "pld-t0-m24-b1"


def test_a_batched_run_times_ar_beside_the_method_and_checks_every_request(real_model, tmp_path, capsys):
    # the suite's other worker shares the cores: this test reads the table, not the contention marks
    # (tests/test_timing_lock.py), so other load does not mark it
    c = serving_cfg(tmp_path, "method=pld", "batch_size=2", "timing.max_other_load=64")
    summary = run_benchmark(c)
    printed = capsys.readouterr()
    assert "| pld | fixed | 2 | - | 1 |" in printed.out and "warning:" not in printed.err  # the run's table
    assert summary["results_dir"].endswith("serving/pld-t0-m24-b2") and summary["forward"] == "eager"
    lo = summary["lossless"]
    assert lo["checked"] == lo["exact"] == 3 and lo["tokens_outside_band"] == 0 and lo["tokens_checked"] > 0
    assert summary["requests"] == 3 and summary["tokens"] > 0
    assert summary["speedup"] == pytest.approx(summary["throughput"] / summary["baseline_throughput"], rel=1e-2)
    assert main_exit_code(summary, c) == 0
    run_dir = tmp_path / "smollm2-135m" / "mini-l3" / "serving" / "pld-t0-m24-b2"
    assert str(run_dir) == summary["results_dir"]
    side = json.loads((run_dir / "method_batch.json").read_text())
    assert [r["question_id"] for r in side["requests"]] and all(len(r["tokens"]) for r in side["requests"])
    assert "| pld | fixed | 2 | - | 1 |" in (run_dir.parent / "serving.md").read_text()
    assert (run_dir.parent / "plots" / "speedup_vs_batch.png").is_file()
    # a rerun reuses both finished sides: the same timings, nothing decoded again
    again = run_benchmark(c)
    assert again["throughput"] == summary["throughput"] and again["baseline_throughput"] == summary["baseline_throughput"]


def test_goodput_under_poisson_arrivals_keeps_every_output(real_model, tmp_path, monkeypatch):
    from specbench.run import serving as batched_run

    real = batched_run.measure_batch_cost  # the real measurement on a smaller grid: the suite's minutes
    monkeypatch.setattr(batched_run, "measure_batch_cost", lambda model, batches: real(
        model, batches, rows=(1, 8, 32), repeats=1, long_context_len=512))
    c = serving_cfg(tmp_path, "method=tr", "batch_size=2", "request_rate=50", "batch_speculation=goodput")
    summary = run_benchmark(c)
    assert summary["results_dir"].endswith("serving/tr-t0-m24-b2-rps50-goodput")
    run_dir = tmp_path / "smollm2-135m" / "mini-l3" / "serving" / "tr-t0-m24-b2-rps50-goodput"
    assert (run_dir / "batch_cost.json").is_file()
    assert summary["lossless"]["exact"] == 3 and summary["lossless"]["tokens_outside_band"] == 0
    side = json.loads((run_dir / "method_batch.json").read_text())
    assert side["policy"] == "goodput" and side["min_gain"] == 0.05  # the policy's margin is on record
    arrivals = [r["arrival"] for r in side["requests"]]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals) and arrivals[-1] > 0  # Poisson, not a closed batch
    assert all(r["admitted"] >= r["arrival"] for r in side["requests"])

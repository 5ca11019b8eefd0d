"""wandb logging in offline mode (no account, no network), and switched off."""

import json
import time
from pathlib import Path

import pytest

from specbench.run.results_io import read_jsonl

RUN = Path(__file__).resolve().parent / "fixtures" / "results" / "smollm2-135m" / "mini" / "tr-t0-m32"


def _inputs(tmp_path, **wandb_cfg):
    cfg = {"method": {"name": "tr", "k": 8}, "model": {"name": "smollm2-135m"}, "task": {"name": "mini"},
           "temperature": 0.0, "results_root": str(tmp_path),
           "wandb": {"enabled": True, "mode": "offline", "project": "specbench-test", "log_plots": True, **wandb_cfg}}
    summary = json.loads((RUN / "summary.json").read_text())
    summary.update(task="mini", speedup={"overall": 1.875, "qa": 2.0}, mat=2.8)
    return cfg, summary, read_jsonl(RUN / "answers.jsonl"), read_jsonl(RUN / "baseline_answers.jsonl")


def test_offline_run_logs_config_questions_summary_and_plots(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    from specbench.report.wandb_log import log_run, question_metrics

    cfg, summary, records, base = _inputs(tmp_path)
    q = question_metrics(records, base)
    assert len(q) == 7 and q[4]["question_id"] == "mini-qa-2" and q[4]["speedup"] == pytest.approx(1.5)
    out = tmp_path / "run"
    run_dir = log_run(cfg, summary, records, base, out)
    assert run_dir is not None and run_dir.parent == out / "wandb" and run_dir.name.startswith("offline-run-")
    (log,) = run_dir.glob("*.wandb")  # the offline log that `wandb sync` uploads
    deadline = time.monotonic() + 20  # wandb-core may still be flushing it when finish() returns
    while b"speedup/overall" not in (data := log.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for key in (b"method/name", b"question/speed", b"question/speedup", b"speedup/overall", b"1.875"):
        assert key in data  # config, per-question steps, summary
    files = run_dir / "files"
    assert list((files / "media" / "table").glob("questions_*.table.json"))
    assert {p.name for p in (out / "plots").glob("*.png")} == {
        "speedup_subtasks.png", "accept_lengths.png", "tokens_over_run.png"}
    media = list((files / "media").rglob("*.png"))
    assert len(media) == 3


def test_disabled_logs_nothing(tmp_path, monkeypatch):
    from specbench.report.wandb_log import log_run

    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg, summary, records, base = _inputs(tmp_path, enabled=False)
    assert log_run(cfg, summary, records, base, tmp_path / "a") is None
    cfg, *_ = _inputs(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert log_run(cfg, summary, records, base, tmp_path / "b") is None
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_config_has_wandb_settings():
    from tests.test_config import cfg

    c = cfg("wandb.mode=online", "wandb.enabled=false")
    assert c["wandb"]["mode"] == "online" and c["wandb"]["enabled"] is False
    assert cfg()["wandb"]["mode"] == "offline" and cfg()["wandb"]["enabled"] is True

"""Sweeps: multirun composition (one directory per run), the SLURM launcher config, and the AR
reference shared by the runs of a sweep (baseline=shared)."""

import multiprocessing as mp
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.run.results_io import read_jsonl
from specbench.run.sweep import SharedBaseline

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def test_multirun_gives_each_run_its_own_directory():
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from specbench.run.plan import results_dir_for, run_settings

    overrides = OverridesParser.create().parse_overrides(["method=ar,tr,pld", "repeat=0,1", "max_new_tokens=32"])
    jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    assert len(jobs) == 6
    dirs = set()
    for job in jobs:
        with initialize_config_dir(config_dir=CONF, version_base=None):
            c = OmegaConf.to_container(compose("config", overrides=list(job)), resolve=True)
        dirs.add(str(results_dir_for(run_settings(c), c["method"]["name"])))
    assert dirs == {f"results/smollm2-135m/mini/{m}-t0-m32{r}" for m in ("ar", "tr", "pld") for r in ("", "-r1")}


def test_slurm_launcher_config_composes():
    import hydra_plugins.hydra_submitit_launcher  # noqa: F401  (the "slurm" extra, in "test")

    with initialize_config_dir(config_dir=CONF, version_base=None):
        c = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "method=ar"],
                    return_hydra_config=True)
    launcher = c.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.gpus_per_node == 1 and launcher.partition == "gpu" and launcher.max_num_timeout == 3
    assert launcher.tasks_per_node == 1 and launcher.signal_delay_s == 120  # plugin defaults still there


IDENT = {"model": "m", "task": "t", "max_new_tokens": 8, "temperature": 0.0}


def _need(ar_dir, qid, log):
    shared = SharedBaseline(ar_dir, IDENT, {"method": {"name": "tr"}})

    def run():
        with open(log, "a") as f:
            f.write(f"{qid}\n")
        return {"question_id": qid, "subtask": "qa", "turns": [{"prompt_ids": [1], "new_tokens": 1}]}

    return shared.get_or_run(qid, run, lambda r: r)["question_id"]


def test_shared_baseline_runs_each_question_once_across_processes(tmp_path):
    ar_dir, log = tmp_path / "ar-t0-m8", tmp_path / "runs.log"
    ctx = mp.get_context("fork")
    with ctx.Pool(4) as pool:
        got = pool.starmap(_need, [(ar_dir, q, log) for q in ("q1", "q2", "q1", "q2", "q1", "q3")])
    assert got == ["q1", "q2", "q1", "q2", "q1", "q3"]
    assert sorted(log.read_text().split()) == ["q1", "q2", "q3"]  # AR ran once per question
    recs = read_jsonl(ar_dir / "answers.jsonl")
    assert sorted(r["question_id"] for r in recs) == ["q1", "q2", "q3"]
    assert all(r["lossless"] == {"status": "exact"} for r in recs)
    assert (ar_dir / "run_config.json").is_file()  # a later method=ar run resumes from these answers


def test_shared_baseline_refuses_other_settings(tmp_path):
    SharedBaseline(tmp_path, IDENT, {})
    with pytest.raises(ValueError, match="other settings"):
        SharedBaseline(tmp_path, dict(IDENT, temperature=0.7), {})


def test_shared_is_a_valid_baseline_mode():
    from specbench.run.plan import run_settings
    from specbench.run.settings import check_values
    from tests.test_config import cfg

    c = cfg("baseline=shared")
    c["max_new_tokens"] = 8
    check_values(run_settings(c))

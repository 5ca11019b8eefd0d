"""Bad input is refused with a message that names the problem and the fix."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.errors import SettingsError
from specbench.main import run_benchmark
from specbench.inputs.questions import SUBTASKS
from specbench.inputs.tasks import load_jsonl_questions, load_task

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def cfg(*overrides):
    """The settings as run.py hands them on: Hydra's plain dict."""
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def plan_of(given, device_name: str = "x86_64 (2 threads)", forward: str = "eager", **settings):
    """A RunPlan made by hand, not resolved on this machine: `given` (a dict, perhaps partial) typed,
    `settings` changed in it."""
    import dataclasses

    from specbench.config import RunPlan
    from specbench.run.plan import run_directory, run_settings

    resolved = dataclasses.replace(run_settings(given), **settings)
    try:
        folder = str(run_directory(resolved))
    except (AttributeError, TypeError):  # partial settings (no method, model or task) name no folder
        folder = ""
    return RunPlan(settings=resolved, device_name=device_name, forward=forward, results_dir=folder)


def test_settings_are_typed_once_and_a_stray_key_is_refused():
    from specbench.config import ModelConfig, RunConfig, TaskConfig
    from specbench.run.plan import run_settings

    s = run_settings(cfg("method=pld", "method.max_ngram_size=4"))
    assert isinstance(s, RunConfig) and isinstance(s.model, ModelConfig) and isinstance(s.task, TaskConfig)
    assert s.method == {"name": "pld", **{k: v for k, v in s.method.items() if k != "name"}}
    assert s.method["max_ngram_size"] == 4 and run_settings(s) is s
    with pytest.raises(SettingsError, match="no run setting is called temprature"):
        run_benchmark(dict(cfg(), temprature=0.7))


def test_default_config_composes():
    c = cfg()
    assert c["method"]["name"] == "tr" and c["model"]["name"] == "smollm2-135m" and c["task"]["name"] == "mini"


@pytest.mark.parametrize("group", ["method", "model", "task"])
def test_every_config_option_composes(group):
    from specbench.registry import available_methods

    options = available_methods() if group == "method" else [f.stem for f in Path(CONF, group).glob("*.yaml")]
    assert options
    for name in options:
        overrides = [f"{group}={name}"]
        if name in ("hf", "jsonl"):
            overrides.append(f"{group}.path=x")
        assert cfg(*overrides)[group]["name"] == name


@pytest.mark.parametrize("group,valid", [("method", "ar, .*tr"), ("model", "gemma3-270m, hf, .*smollm2-135m"),
                                         ("task", "agent_loop, code_edit, dataset, jsonl, long, mini, spec_bench")])
def test_unknown_group_option_lists_valid_names(group, valid):
    from run import check_group_options  # run.py refuses these before Hydra (tests/test_bad_inputs.py)

    with pytest.raises(SettingsError, match=rf"unknown {group} 'nope'. Valid: {valid}"):
        check_group_options([f"{group}=nope"])
    with pytest.raises(SettingsError, match="unknown method 'nope'"):
        check_group_options(["-m", "method=tr,nope"])  # a sweep's list
    check_group_options(["method=tr,pld", "model=hf", "task=mini", "method.k=4", "+method.x=y"])


def test_unknown_method_name_lists_valid_names():
    with pytest.raises(SettingsError, match=r"unknown method 'nope'. Valid methods: .*ar.*tr"):
        run_benchmark(cfg("method.name=nope"))


@pytest.mark.parametrize("override,message", [
    ("max_new_tokens=0", "max_new_tokens must be at least 1"),
    ("warmup=-1", "warmup"),
    ("baseline=sometimes", "baseline must be"),
])
def test_impossible_settings(override, message):
    with pytest.raises(SettingsError, match=message):
        run_benchmark(cfg(override))


def test_malformed_question_file_names_file_and_line(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text('{"question_id": 1, "category": "qa", "turns": ["hi"]}\n{"question_id": 2, "turns": \n')
    with pytest.raises(ValueError, match=rf"{p}:2: not valid JSON"):
        load_jsonl_questions(p)
    p.write_text('{"question_id": 1, "category": "qa"}\n')
    with pytest.raises(ValueError, match=rf"{p}:1: missing field\(s\) turns"):
        load_jsonl_questions(p)
    with pytest.raises(FileNotFoundError, match="Spec-Bench"):
        load_jsonl_questions(tmp_path / "missing.jsonl")


def test_spec_bench_task_needs_a_path():
    with pytest.raises(ValueError, match="task.path"):
        load_task({"name": "spec_bench", "kind": "spec_bench", "path": None})


def test_mini_task_covers_every_subtask_twice():
    qs = load_task(cfg()["task"])
    assert sorted(q.subtask for q in qs) == sorted(list(SUBTASKS) * 2)


def test_spec_bench_per_subtask_selection(spec_bench_path):
    qs = load_task({"name": "spec_bench", "kind": "spec_bench", "path": str(spec_bench_path), "per_subtask": 2})
    assert [q.subtask for q in qs] == [s for s in SUBTASKS for _ in range(2)]
    assert all(len(q.turns) == 2 for q in qs if q.subtask == "mt")


def test_subtask_filter_and_its_error(spec_bench_path):
    task = {"name": "spec_bench", "kind": "spec_bench", "path": str(spec_bench_path), "per_subtask": 1,
            "subtasks": ["rag", "summarization"]}
    assert [q.subtask for q in load_task(task)] == ["summarization", "rag"]
    with pytest.raises(ValueError, match="Valid subtasks: .*math_reasoning"):
        load_task(dict(task, subtasks=["poetry"]))

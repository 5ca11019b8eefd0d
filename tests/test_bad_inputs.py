"""Bad inputs, end to end: each is refused before anything is loaded, with one `error: ...` line on
stderr that names the problem and the fix, exit code 2.

Most cases run in-process (Hydra's compose API, then run.py's run_config, the code path of
`python run.py`). A few run run.py's `__main__` in a subprocess, to prove the exit is traceback-free.
Either way model loading, the cost curve and drafter building are patched to fail, so a case that got
that far would show: "before anything loads" is checked, not timed (a timed limit failed on a slow
machine whose `import torch` alone took 10 s). The real model is never loaded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import run as cli
from specbench.run import plan, session, single, target
from specbench.errors import SettingsError
from specbench.inputs.models import model_config, resolve_device, run_dtype
from specbench.registry import available_methods, drafter_class
from tests.test_config import CONF, plan_of

ROOT = Path(__file__).resolve().parents[1]

# (id, overrides ({tmp}: the test's own directory, see make_inputs), expected message, how)
CASES = [
    ("unknown method", ["method=nope"],
     r"unknown method 'nope'. Valid: ar, (\w+, )*tr, tr_adaptive", "subprocess"),
    ("missing question file", ["task=jsonl", "task.path={tmp}/missing.jsonl"],
     r"question file '.*missing.jsonl' not found.*task.path", "in-process"),
    ("malformed question file", ["task=jsonl", "task.path={tmp}/bad.jsonl"],
     r".*bad.jsonl:2: not valid JSON .*each line must be one JSON object", "subprocess"),
    ("max_new_tokens=0", ["max_new_tokens=0"], r"max_new_tokens must be at least 1, got 0", "in-process"),
    ("tr method.k=0", ["method=tr", "method.k=0"], r"needs k >= 1 .*method.k=0", "in-process"),
    ("tr empty tree", ["method=tr", "method.tree=[]"], r"tree template \(method.tree\) has no draft nodes", "in-process"),
    ("temperature=-1", ["temperature=-1"], r"temperature must be 0 \(greedy\) or positive, got -1", "in-process"),
    ("top_p=1.5", ["top_p=1.5"], r"top_p must be in \(0, 1\] \(1 = off\), got 1.5", "in-process"),
    ("unknown compile setting", ["compile=maybe"], r"compile must be one of auto, on, off, got 'maybe'", "in-process"),
    ("cost curve of the other forward", ["compile=on", "cost_curve={tmp}/eager_curve.json"],
     r"measured on the eager forward, but this run uses the compiled(-packed)? one; profile it with "
     r"scripts/profile_cost.py --compile", "in-process"),
    ("unknown compile_products", ["compile_products=fast"],
     r"compile_products must be one of auto, packed, inductor, got 'fast'", "in-process"),
    ("unknown dtype", ["dtype=float64"], r"unknown dtype 'float64'. Valid dtypes: auto, float32, float16, bfloat16", "in-process"),
    ("task.per_subtask=0", ["task.per_subtask=0"], r"task.per_subtask must be at least 1, got 0", "in-process"),
    ("results_dir of other settings", ["results_dir={tmp}/other_run"],
     r"other_run holds answers made with other settings \{'temperature': \(0.7, 0.0\)\}; give another results_dir",
     "in-process"),
    ("missing REST datastore", ["method=rest", "method.datastore=/nonexistent"],
     r"REST datastore '/nonexistent' not found .*build_rest_datastore.py", "subprocess"),
    ("corrupt REST datastore", ["method=rest", "method.datastore={tmp}/garbage_store"],
     r"REST datastore '.*garbage_store': meta.json is unreadable .*build_rest_datastore.py", "in-process"),
    ("wrong Medusa heads dir", ["method=medusa", "method.heads={tmp}/not_heads"],
     r"Medusa heads directory '.*not_heads' has no config.json; pass method.heads=<dir>", "in-process"),
    ("wrong EAGLE head dir", ["method=eagle", "method.head={tmp}/not_heads"],
     r"EAGLE head directory '.*not_heads' has no config.json; pass method.head=<dir>", "in-process"),
    ("missing model path", ["model=hf", "model.path=/nonexistent"],
     r"model.path '/nonexistent' not found; give a local model directory or a hub id", "in-process"),
    ("misspelt method setting", ["method=tr", "method.nonexistent=1"],
     r"unknown setting 'method.nonexistent': method tr has no setting 'nonexistent'; its settings are cold_start, k, "
     r"prefill_update, tree, update", "subprocess"),
    ("method setting of the wrong type", ["method=tr", "method.k=abc"],
     r"method.k=abc: Value 'abc' of type 'str' could not be converted to Integer", "subprocess"),
    ("misspelt run setting in a sweep", ["-m", "method=pld", "temperatur=0,0.7"],
     r"unknown setting 'temperatur': the run has no setting 'temperatur'; its settings are baseline, batch_size, batch_speculation, compile", "subprocess"),
    ("batch size below one", ["batch_size=0"], r"batch_size must be at least 1, got 0", "in-process"),
    ("negative request rate", ["batch_size=4", "request_rate=-1"],
     r"request_rate must be positive \(requests per second\) or null, got -1", "in-process"),
    ("unknown batch speculation", ["batch_size=4", "batch_speculation=sometimes"],
     r"batch_speculation must be fixed or goodput, got 'sometimes'", "in-process"),
    ("unknown host memory policy", ["host_memory=pool"], r"host_memory must be keep or system, got 'pool'",
     "in-process"),
    ("sampling in a batched run", ["batch_size=4", "temperature=0.7"],
     r"serving runs \(serving=true, batch_size > 1 or request_rate\) decode greedily; set temperature=0", "in-process"),
    ("compiled batched run", ["request_rate=2", "compile=on"],
     r"batched runs use the eager forward .*; set compile=off or auto", "in-process"),
    ("device=cuda without a GPU", ["device=cuda"], r"device=cuda was asked for but torch sees no CUDA GPU; use device=cpu",
     "in-process"),
    ("duplicate question ids", ["task=jsonl", "task.path={tmp}/duplicate_ids.jsonl"],
     r".*duplicate_ids.jsonl:3: duplicate question_id 7 \(first on line 1\); each question needs its own id",
     "in-process"),
    ("empty turn", ["task=jsonl", "task.path={tmp}/empty_turn.jsonl"],
     r".*empty_turn.jsonl:2: question 'q2' has an empty turn \(turn 2\); every turn must hold text", "in-process"),
    ("task.limit=0", ["task.limit=0"], r"task.limit must be at least 1 \(a number of questions; null: all\), got 0",
     "in-process"),
    ("max_new_tokens beyond the context", ["max_new_tokens=9000"],
     r"max_new_tokens=9000 is beyond the context of model smollm2-135m \(8192 positions, prompt included\); "
     r"set max_new_tokens below 8192", "in-process"),
    ("corrupt run_config.json", ["results_dir={tmp}/corrupt_run"],
     r".*corrupt_run/run_config.json: not valid JSON \(Expecting value, line 1\); the file is corrupt", "in-process"),
    ("results folder that cannot be made", ["results_dir={tmp}/bad.jsonl/run"],
     r"cannot create .*bad.jsonl/run: Not a directory; free space, make the folder writable", "in-process"),
]


def make_inputs(tmp: Path) -> None:
    """The files the cases point at: a malformed question file, a results directory of other
    settings, a datastore directory of garbage, a directory that holds no Medusa heads."""
    (tmp / "bad.jsonl").write_text('{"question_id": 1, "category": "qa", "turns": ["hi"]}\n{"question_id": 2, "turns": \n')
    (tmp / "other_run").mkdir()  # as a run of the defaults at temperature 0.7 leaves it
    with initialize_config_dir(config_dir=CONF, version_base=None):
        other = OmegaConf.to_container(compose("config", overrides=["temperature=0.7"]), resolve=True)
    device = resolve_device("auto")
    # as plan_run resolves it
    identity = plan.run_identity(plan_of(other, max_new_tokens=other["task"]["max_new_tokens"], device=str(device),
                                         dtype=run_dtype(other["dtype"], device, model_config(other["model"]))))
    (tmp / "other_run" / "run_config.json").write_text(json.dumps({"identity": identity}))
    (tmp / "garbage_store").mkdir()
    for name in ("meta.json", "tokens.npy", "sa.npy"):
        (tmp / "garbage_store" / name).write_bytes(bytes(range(256)) * 4)
    (tmp / "eager_curve.json").write_text(json.dumps({"widths": [1, 2], "times": [0.05, 0.08]}))
    (tmp / "not_heads").mkdir()
    (tmp / "not_heads" / "notes.txt").write_text("not a heads directory\n")
    (tmp / "duplicate_ids.jsonl").write_text('{"question_id": 7, "category": "qa", "turns": ["a"]}\n'
                                             '{"question_id": 8, "category": "qa", "turns": ["b"]}\n'
                                             '{"question_id": 7, "category": "qa", "turns": ["c"]}\n')
    (tmp / "empty_turn.jsonl").write_text('{"question_id": "q1", "category": "qa", "turns": ["a"]}\n'
                                          '{"question_id": "q2", "category": "writing", "turns": ["b", "  "]}\n')
    (tmp / "corrupt_run").mkdir()  # a run_config.json cut off (a full disk, an editor)
    (tmp / "corrupt_run" / "run_config.json").write_text("")


def _not_reached(what):
    def fail(*args, **kwargs):
        raise AssertionError(f"{what} was reached: the bad input was not refused before loading")
    return fail


def run_in_process(overrides: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """run.py's code path without the interpreter start: exit code and stderr."""
    monkeypatch.setattr(target, "load_model", _not_reached("load_model"))
    for module, name in ((session, "run_cost_curve"), (single, "build_drafter")):
        monkeypatch.setattr(module, name, _not_reached(name))
    cli.check_group_options(overrides)
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config", overrides=overrides)
    code = cli.run_config(cfg)
    return code, capsys.readouterr().err


# `python run.py ARGS` with the loaders patched as in run_in_process: reaching one exits 3 and names it
SUBPROCESS = """
import runpy, sys
from specbench.run import session, single, target
def not_reached(what):
    def fail(*args, **kwargs):
        sys.stderr.write(what + " was reached: the bad input was not refused before loading\\n")
        sys.exit(3)
    return fail
target.load_model = not_reached("load_model")
session.run_cost_curve = not_reached("run_cost_curve")
single.build_drafter = not_reached("build_drafter")
sys.argv = ["run.py", *sys.argv[1:]]
runpy.run_path("run.py", run_name="__main__")
"""


def run_subprocess(overrides: list[str], tmp: Path) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-c", SUBPROCESS, *overrides, f"hydra.run.dir={tmp}/hydra"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    return out.returncode, out.stderr


@pytest.mark.parametrize("case,overrides,message,how", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_in_one_line(case, overrides, message, how, tmp_path, monkeypatch, capsys):
    if case == "device=cuda without a GPU" and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    make_inputs(tmp_path)
    overrides = [o.format(tmp=tmp_path) for o in overrides] + [f"results_root={tmp_path}/results"]
    if how == "subprocess":
        code, err = run_subprocess(overrides, tmp_path)
    else:
        code, err = run_in_process(overrides, monkeypatch, capsys)
    lines = err.strip().splitlines()
    print(f"[{how}] {err.strip()}")
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: ")
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "results").exists()  # nothing written either


def test_every_method_says_what_it_accepts():
    """Each method's settings are the keys of its composed config (method=<name>, typed by its Settings
    dataclass); the defaults pass, an unknown name or a value of the wrong type is refused naming the
    method's settings."""
    from tests.test_config import cfg

    target = {"model_name": "smollm2-135m", "device": "cpu", "dtype_name": "float32"}
    for name in available_methods():
        cls = drafter_class(name)
        conf = cfg(f"method={name}")["method"]
        conf.pop("name")
        assert set(cls.parameters()) == set(conf), name
        assert cls.check_settings(conf, target) == {**cls.parameters(), **conf}
        with pytest.raises(SettingsError, match=f"method {name} has no setting bogus; its settings are"):
            cls.check_settings({"bogus": 1}, target)
    with pytest.raises(SettingsError, match=r"method.k must be an integer \(default 8\), got 'eight'"):
        drafter_class("tr").check_settings({"k": "eight"}, target)
    with pytest.raises(SettingsError, match="method.typical must be true or false"):
        drafter_class("medusa").check_settings({"typical": "yes"}, target)


def load_script(name: str):
    """scripts/<name>.py as a module (the scripts are not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("script", ["profile_cost", "profile_kernels", "bench_engine"])
def test_scripts_refuse_an_unknown_model_with_the_valid_names(script, capsys):
    """The scripts' `--model NAME` goes through `named_model_config`: one `error:` line, exit 2, before
    any model loads."""
    with pytest.raises(SystemExit) as exc:
        load_script(script).main(["--model", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: unknown model 'nope'; valid names:" in err and "smollm2-135m" in err


def test_bench_engine_refuses_an_unknown_method_before_loading_anything(capsys):
    with pytest.raises(SystemExit) as exc:
        load_script("bench_engine").main(["--step-overheads", "tr_fused,nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown method 'nope'. Valid methods:" in err and "tr_fused" in err


@pytest.mark.parametrize("method, message", [
    ("nope", "unknown method 'nope'"),
    ("tr_fused:retrieval=bogus", "method.retrieval must be one of"),
    ("tr_fused:bogus=1", "method tr_fused has no setting bogus"),
])
def test_head_to_head_refuses_a_bad_method_in_one_line_before_loading(method, message, capsys, monkeypatch):
    mod = load_script("head_to_head")
    monkeypatch.setattr(mod, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    code = mod.main(["--questions", str(ROOT / "data/code_edit/code_edit.jsonl"),
                     "--cost-curve", str(ROOT / "results/cpu-tasks/cost_curve.json"),
                     "--methods", "suffix", method])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_head_to_head_reads_a_methods_settings_after_its_colon():
    parse = load_script("head_to_head").parse_method
    assert parse("suffix") == ("suffix", {})
    assert parse("tr_fused:retrieval=suffix,calibrate=true,max_nodes=40") == (
        "tr_fused", {"retrieval": "suffix", "calibrate": True, "max_nodes": 40})

"""task=code_edit (data/code_edit/code_edit.jsonl): the committed prompts hold what they say, measured
again with the real tokenizer; each edit names what to change and can be checked against the code it
was made from; the builder gives the committed files byte for byte; a window too short for the
prompts is refused in one line."""

from __future__ import annotations

import ast
import importlib.util
import json
import platform
import re
import sys
import textwrap
from pathlib import Path

import pytest

from specbench.inputs.chat import prompt_ids
from specbench.inputs.tasks import CODE_EDIT_TASK, load_task
from tests.test_config import cfg

ROOT = Path(__file__).resolve().parents[1]
datasets = pytest.importorskip("datasets")


def load_script(name: str):
    """scripts/<name>.py as a module, registered first (its dataclasses look themselves up)."""
    sys.path.insert(0, str(ROOT / "scripts"))  # the script imports its sibling make_long_task
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


make = load_script("make_code_edit_task")
RECORDS = [json.loads(line) for line in CODE_EDIT_TASK.read_text(encoding="utf-8").splitlines()]
STDLIB = Path(make.sysconfig.get_paths()["stdlib"])


def test_eight_prompts_of_each_edit_kind_alternating_shapes():
    qs = load_task(cfg("task=code_edit")["task"])
    assert len(qs) == 40 and all(len(q.turns) == 1 and q.system is None for q in qs)
    for kind in make.KINDS:
        mine = [q for q in qs if q.subtask == kind]
        assert [q.question_id for q in mine] == [f"code_edit-{kind}-{n}" for n in range(1, 9)]
        assert [q.category for q in mine] == ["function", "file"] * 4
    # the subtasks are the edit kinds, in file order; per_subtask=2 takes one of each shape
    two = load_task(dict(cfg("task=code_edit")["task"], per_subtask=2, subtasks=["fix_bug"]))
    assert [q.category for q in two] == ["function", "file"]
    assert cfg("task=code_edit")["task"]["max_new_tokens"] == 512


def test_each_function_once_and_every_prompt_returns_it_whole():
    functions = [re.search(r"the function (\S+)$", r["source"]).group(1) for r in RECORDS]
    modules = [re.search(r"(Lib/\S+) lines", r["source"]).group(1) for r in RECORDS]
    assert len(set(zip(modules, functions))) == len(RECORDS)
    for r in RECORDS:
        assert r["turns"][0].rstrip().endswith(make.INSTRUCTION_TAIL), r["question_id"]
        assert 200 <= r["input_tokens"] <= 2000, r["question_id"]


def function_in(record: dict):
    """(module text, the function's node and source) a record was made from, read again."""
    module = make.Module(STDLIB, re.search(r"Lib/(\S+) lines", record["source"]).group(1))
    name = re.search(r"the function (\S+)$", record["source"]).group(1)
    fn = next(f for q, f in make.functions(module.tree) if q == name)
    return module, fn, module.source(fn)


def built_with() -> str:
    """The Python whose standard library the committed prompts were read from (their README says)."""
    readme = (CODE_EDIT_TASK.parent / "README.md").read_text(encoding="utf-8")
    return re.search(r"standard library of Python (\S+) ", readme).group(1)


@pytest.mark.skipif(built_with() != platform.python_version(),
                    reason="data/code_edit was read from another Python's standard library")
def test_each_edit_is_named_and_checkable_against_its_function():
    for r in RECORDS:
        module, fn, source = function_in(r)
        turn, kind = r["turns"][0], r["subtask"]
        code = turn.split("```python\n", 1)[1].rsplit("```", 1)[0]
        if kind == "fix_bug":  # the code holds the bug the prompt quotes; the original is the answer
            line, wrong, right = re.search(r"in the line `(.+)`, the `(\S+)` should be `(\S+)`", turn).groups()
            assert code.endswith(make.fix_bug(fn, source)[1]) and line in code and line.replace(wrong, right, 1) \
                in source and line not in source, r["question_id"]
            continue
        assert code.endswith(source), r["question_id"]  # the function as the module has it, last
        if kind == "rename":
            old = re.search(r"Rename the local variable `(\w+)` to `\1_value`", turn).group(1)
            stored = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            assert old in stored and old not in {a.arg for a in make.parameters(fn)}
        elif kind == "add_parameter":
            assert f"`{make.NEW_PARAMETER}=False` as the last parameter of `{fn.name}`" in turn
        elif kind == "type_hints":
            assert not fn.returns and not any(a.annotation for a in make.parameters(fn))
        elif kind == "translate_comments":
            assert len(make.comments(source)) >= 2


def test_a_flipped_comparison_is_the_one_named():
    fn_text = textwrap.dedent('''\
        def clamp(x, lo, hi):
            """Keep x within [lo, hi]."""
            if x < lo:  # below
                return lo
            return min(x, hi)
        ''')
    fn = ast.parse(fn_text).body[0]
    note, buggy = make.fix_bug(fn, fn_text)
    assert note == "`clamp` has a bug: in the line `if x <= lo:  # below`, the `<=` should be `<`. Fix it."
    assert buggy == fn_text.replace("x < lo", "x <= lo")
    assert make.rename(fn, fn_text) is None  # no local variable at all
    assert make.type_hints(fn, fn_text) == "Add type hints to `clamp`: annotate every parameter and the return value."


def test_every_prompt_measures_what_it_says(real_model):
    _, tok, _ = real_model
    run = cfg("task=code_edit")
    for r in RECORDS:
        n = len(prompt_ids(tok, [{"role": "user", "content": r["turns"][0]}], run["model"]["chat_template"]))
        assert n == r["input_tokens"], r["question_id"]
        assert n + run["task"]["max_new_tokens"] < run["model"]["context_length"]


def test_regenerating_gives_the_committed_files_byte_for_byte(real_model, tmp_path):
    if built_with() != platform.python_version():
        pytest.skip(f"data/code_edit was built from Python {built_with()}'s standard library, this is "
                    f"{platform.python_version()}")
    _, tok, _ = real_model
    make.write(tmp_path, make.build(make.Counter(tok), STDLIB), STDLIB)
    for f in sorted(CODE_EDIT_TASK.parent.iterdir()):
        assert (tmp_path / f.name).read_bytes() == f.read_bytes(), f.name


def run_refused(overrides: list[str], tmp_path: Path, monkeypatch, capsys) -> str:
    """A run of `overrides` on a model directory, refused: its one stderr line (no question answered)."""
    from hydra import compose, initialize_config_dir

    import run as cli
    from specbench.run import single
    from tests.test_config import CONF

    def never(*args, **kwargs):
        raise AssertionError("a question was answered: the prompt past the window was not refused")

    for name in ("warm_up", "answer_questions"):
        monkeypatch.setattr(single, name, never)
    overrides = [*overrides, "warmup=0", "cost_curve=off", "progress=false", "wandb.enabled=false",
                 f"results_root={tmp_path}/results"]
    with initialize_config_dir(config_dir=CONF, version_base=None):
        code = cli.run_config(compose("config", overrides=overrides))
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("Loading weights")]  # transformers' bar
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_window_too_short_for_the_prompts_is_refused_in_one_line(tmp_path, real_model, monkeypatch, capsys):
    from tests.conftest import save_tiny_llama_dir

    model = save_tiny_llama_dir(tmp_path / "short", real_model[1], max_positions=1024)
    capsys.readouterr()  # the saving's progress bars
    line = run_refused(["model=hf", f"model.path={model}", "task=code_edit"], tmp_path, monkeypatch, capsys)
    assert re.fullmatch(r"error: question 'code_edit-rename-2' \(subtask rename\): its prompt of \d+ tokens and "
                        r"max_new_tokens=512 need \d+ positions, beyond the context of model hf \(1024 positions\)"
                        r", as do 19 more questions; use shorter prompts", line), line

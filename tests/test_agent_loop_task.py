"""task=agent_loop (data/agent_loop/agent_loop.jsonl): sessions with a system prompt of tool descriptions
and 4-5 turns of tool output, over one repository, the sessions on a module sharing its function; the
tool outputs are read from the files they name; the committed lengths measured again with the real
tokenizer; the builder gives the committed files byte for byte; a question's system prompt reaches its
prompt; a window too short for a whole session is refused in one line, naming the fix."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import pytest

from specbench.errors import InputError, SettingsError
from specbench.inputs.chat import first_turn, last_prompt_tokens, opening, prompt_ids, vicuna_prompt
from specbench.inputs.datasets_task import load_dataset_questions
from specbench.inputs.questions import Question
from specbench.inputs.tasks import AGENT_LOOP_TASK, load_jsonl_questions, load_task
from specbench.inputs.window import check_sessions_fit
from tests.test_code_edit_task import load_script
from tests.test_config import cfg

datasets = pytest.importorskip("datasets")
make = load_script("make_agent_loop_task")
RECORDS = [json.loads(line) for line in AGENT_LOOP_TASK.read_text(encoding="utf-8").splitlines()]
STDLIB = Path(make.sysconfig.get_paths()["stdlib"])
README = (AGENT_LOOP_TASK.parent / "README.md").read_text(encoding="utf-8")
BUILT_WITH = re.search(r"standard library of Python (\S+) ", README).group(1)


def test_twelve_sessions_of_three_kinds_over_one_repository():
    qs = load_task(cfg("task=agent_loop")["task"])
    assert len(qs) == 12 and all(q.system == make.SYSTEM for q in qs)
    modules = [Path(m).stem for m in make.REPO]
    assert [q.question_id for q in qs] == [f"agent_loop-{k}-{m}" for k in make.KINDS for m in modules]
    assert [len(q.turns) for q in qs] == [5] * 4 + [4] * 8
    # the three sessions on a module work on one function; per_subtask=1 takes them
    functions = {}
    for r in RECORDS:
        functions.setdefault(r["question_id"].rsplit("-", 1)[1], set()).add(r["source"])
    assert all(len(s) == 1 for s in functions.values()) and len(functions) == 4
    one = load_task(dict(cfg("task=agent_loop")["task"], per_subtask=1))
    assert [q.question_id for q in one] == [f"agent_loop-{k}-{modules[0]}" for k in make.KINDS]
    assert cfg("task=agent_loop")["task"]["max_new_tokens"] == 512


def test_the_task_reads_the_same_through_datasets():
    assert load_dataset_questions(str(AGENT_LOOP_TASK)) == load_jsonl_questions(AGENT_LOOP_TASK)


@pytest.mark.skipif(BUILT_WITH != platform.python_version(), reason="built from another Python's standard library")
def test_tool_outputs_are_read_from_the_files_they_name():
    repo = make.Repo(STDLIB)
    for r in RECORDS:
        path, first, last = re.search(r"(lib/\S+) lines (\d+)-(\d+)", r["source"]).groups()
        lines = repo.files[path].splitlines()
        shown = [t for t in r["turns"] if f'read_file {{"path": "{path}"' in t]
        assert len(shown) == 1, r["question_id"]
        numbered = re.findall(r"^ *(\d+)(?:  (.*))?$", shown[0], flags=re.M)  # a blank line: its number
        assert [int(n) for n, _ in numbered] == list(range(int(first), int(last) + 1))
        differ = [n for n, text in numbered if text != lines[int(n) - 1].rstrip()]
        assert len(differ) == (1 if r["subtask"] == "bugfix" else 0), r["question_id"]  # the bug put in
        for hit in re.findall(r"^((?:lib|tests)/\S+):(\d+): (.*)$", "\n".join(r["turns"]), flags=re.M):
            assert repo.files[hit[0]].splitlines()[int(hit[1]) - 1].strip() == hit[2]


def test_every_length_measures_what_it_says(real_model):
    _, tok, _ = real_model
    template = cfg("task=agent_loop")["model"]["chat_template"]
    for q, r in zip(load_task(cfg("task=agent_loop")["task"]), RECORDS):
        assert len(prompt_ids(tok, first_turn(q), template)) == r["input_tokens"], r["question_id"]
        assert last_prompt_tokens(tok, q, template) == r["turns_tokens"], r["question_id"]


def test_a_system_prompt_opens_the_conversation(real_model):
    _, tok, _ = real_model
    agent = Question("a", "agent", ["List the files."], "bugfix", "You act through tools.")
    plain = Question("b", "writing", ["Write a haiku."])
    assert opening(plain) == [] and first_turn(agent)[0] == {"role": "system", "content": "You act through tools."}
    text = tok.decode(prompt_ids(tok, first_turn(agent)))
    assert text.startswith("<|im_start|>system\nYou act through tools.<|im_end|>\n<|im_start|>user\nList the files.")
    assert "SmolLM" in tok.decode(prompt_ids(tok, first_turn(plain)))  # the template's own default stays
    assert vicuna_prompt(first_turn(agent)) == "You act through tools. USER: List the files. ASSISTANT:"
    # one turn: the last prompt is the first
    assert last_prompt_tokens(tok, agent) == len(prompt_ids(tok, first_turn(agent)))


def test_a_bad_system_prompt_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question_id": 1, "turns": ["hi"], "system": ""}) + "\n")
    with pytest.raises(SettingsError, match=r"q.jsonl:1: system must be a non-empty string"):
        load_jsonl_questions(path)


def test_a_window_too_short_for_a_whole_session_is_refused_naming_the_fix():
    sessions = [(r["question_id"], r["subtask"], len(r["turns"]), r["turns_tokens"]) for r in RECORDS]
    check_sessions_fit(sessions, 512, 8192, "smollm2-135m")  # SmolLM2's window holds every session
    longest = max(sessions, key=lambda s: s[3] + (s[2] - 1) * 528 + 512)
    need = longest[3] + (longest[2] - 1) * 528 + 512
    check_sessions_fit(sessions, 512, need, "m")  # exactly enough
    with pytest.raises(InputError) as e:
        check_sessions_fit(sessions, 512, need - 1, "m")
    fits = min((need - 1 - t - 16 * (n - 1)) // n for _, _, n, t in sessions)
    assert str(e.value) == (f"session {longest[0]!r} (subtask {longest[1]}): {longest[2]} turns of {longest[3]} "
                            f"prompt tokens and {longest[2]} answers of max_new_tokens=512 need up to {need} "
                            f"positions, beyond the context of model m ({need - 1} positions); set max_new_tokens "
                            f"to at most {fits}")
    check_sessions_fit(sessions, fits, need - 1, "m")  # the fix it names holds
    with pytest.raises(InputError, match=r"\(and 11 more\).*use a model with a longer window$"):
        check_sessions_fit(sessions, 512, 1000, "m")
    check_sessions_fit(sessions, 512, None, "m")  # an unknown window: nothing to check


def test_regenerating_gives_the_committed_files_byte_for_byte(real_model, tmp_path):
    if BUILT_WITH != platform.python_version() or not (STDLIB / "test" / "test_heapq.py").is_file():
        pytest.skip(f"data/agent_loop was built from Python {BUILT_WITH}'s standard library and its tests")
    _, tok, _ = real_model
    template = cfg("task=agent_loop")["model"]["chat_template"]
    make.write(tmp_path, make.build(tok, template, STDLIB), STDLIB)
    for f in sorted(AGENT_LOOP_TASK.parent.iterdir()):
        assert (tmp_path / f.name).read_bytes() == f.read_bytes(), f.name

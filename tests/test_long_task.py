"""task=long (data/long/long.jsonl) and task=dataset: the committed buckets hold what they say,
measured again with the real tokenizer; any dataset maps its columns to questions; Spec-Bench's file
loads the same either way; bad columns are refused in one line before anything loads."""

from __future__ import annotations

import importlib.util
import json
import platform
import re
import socket
import sys
from pathlib import Path

import pytest

from specbench.errors import MissingFileError, SettingsError
from specbench.inputs.chat import prompt_ids
from specbench.inputs.datasets_task import load_dataset_questions
from specbench.inputs.questions import Question
from specbench.inputs.tasks import LONG_TASK, load_jsonl_questions, load_task
from tests.test_config import cfg

ROOT = Path(__file__).resolve().parents[1]
datasets = pytest.importorskip("datasets")


def load_script():
    """scripts/make_long_task.py as a module, registered first (its dataclasses look themselves up)."""
    spec = importlib.util.spec_from_file_location("make_long_task", ROOT / "scripts" / "make_long_task.py")
    module = sys.modules.setdefault("make_long_task", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


make = load_script()
RECORDS = [json.loads(line) for line in LONG_TASK.read_text(encoding="utf-8").splitlines()]


# -- task=long ---------------------------------------------------------------------------------------

def test_long_task_has_three_prompts_of_each_kind_per_bucket():
    qs = load_task(cfg("task=long")["task"])
    assert len(qs) == 24 and all(len(q.turns) == 1 for q in qs)
    for bucket in ("1k", "2k", "4k", "8k"):
        in_bucket = [q for q in qs if q.subtask == bucket]
        assert [q.question_id for q in in_bucket] == [f"long-{kind}-{bucket}-{n}" for n in (1, 2, 3)
                                                      for kind in ("prose", "code")]
        assert [q.category for q in in_bucket] == ["long-prose", "long-code"] * 3
    # per_subtask=2 takes one of each kind per bucket; a bucket is a subtask like Spec-Bench's columns
    two = load_task(dict(cfg("task=long")["task"], per_subtask=2, subtasks=["8k"]))
    assert [q.question_id for q in two] == ["long-prose-8k-1", "long-code-8k-1"]


def test_long_task_reads_the_same_through_datasets():
    assert load_dataset_questions(str(LONG_TASK)) == load_task({"name": "long", "kind": "long"})


def test_every_prompt_measures_what_it_says_within_its_bucket(real_model):
    """input_tokens counted again as a run counts a first turn: the model's chat template applied."""
    _, tok, _ = real_model
    run = cfg("task=long")
    for r in RECORDS:
        n = len(prompt_ids(tok, [{"role": "user", "content": r["turns"][0]}], run["model"]["chat_template"]))
        target = make.BUCKETS[r["subtask"]]
        assert n == r["input_tokens"], r["question_id"]
        assert abs(n - target) <= make.TOLERANCE * target, (r["question_id"], n)
        assert n + run["task"]["max_new_tokens"] < run["model"]["context_length"]  # the answer fits the window


def test_regenerating_gives_the_committed_files_byte_for_byte(real_model, tmp_path):
    """Needs the full question.jsonl the README names (by sha256) and the Python it read its code from."""
    questions = make.default_questions()
    readme = (LONG_TASK.parent / "README.md").read_text(encoding="utf-8")
    if not questions.is_file() or make.sha256(questions) not in readme:
        pytest.skip("Spec-Bench's full question.jsonl is not at hand ($SPECBENCH_QUESTIONS)")
    built_with = re.search(r"standard library of Python (\S+) ", readme).group(1)
    if built_with != platform.python_version():
        pytest.skip(f"data/long was built from Python {built_with}'s standard library, this is "
                    f"{platform.python_version()}")
    _, tok, _ = real_model
    stdlib = Path(make.sysconfig.get_paths()["stdlib"])
    records = make.build(make.Counter(tok), questions, stdlib)
    make.write(tmp_path, records, questions, stdlib, "smollm2-135m")
    for f in sorted(LONG_TASK.parent.iterdir()):
        assert (tmp_path / f.name).read_bytes() == f.read_bytes(), f.name


def test_gemma_buckets_hold_what_they_say_within_its_window():
    """data/long-gemma3: the 16k and 32k buckets SmolLM2's window cannot hold, counted with Gemma-3's
    tokenizer when it was built (scripts/make_long_task.py --model gemma3-270m)."""
    from specbench.inputs.models import named_model_config

    layout = make.LAYOUTS["gemma3-270m"]
    path = ROOT / layout.out / "long.jsonl"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    qs = load_task({"name": "long", "kind": "long", "path": str(path)})
    assert [q.question_id for q in qs] == [f"long-{kind}-{b}-{n}" for b in layout.buckets
                                           for n in range(1, layout.per_kind + 1) for kind in ("prose", "code")]
    window = named_model_config("gemma3-270m")["context_length"]
    for r in records:
        target = layout.buckets[r["subtask"]]
        assert abs(r["input_tokens"] - target) <= make.TOLERANCE * target, r["question_id"]
        assert r["input_tokens"] + cfg("task=long")["task"]["max_new_tokens"] < window
    sources = [r["source"] for r in records if r["category"] == "long-code"]
    assert len({s.split(" lines")[0] for s in sources}) == len(sources)  # each module once
    readme = (path.parent / "README.md").read_text(encoding="utf-8")
    assert "Gemma-3's 32,768-token window" in readme and "--model gemma3-270m --out data/long-gemma3" in readme


def test_builder_fits_each_kind_to_a_bucket(real_model, spec_bench_path):
    """On the sample shipped with the tests, where the full question.jsonl is not at hand."""
    _, tok, _ = real_model
    count = make.Counter(tok)
    rag = make.spec_bench_docs(spec_bench_path, "rag")
    prompt, n, source = make.answer_item(count, rag, 1000, first=False)
    assert abs(n - 1000) <= 20 and n == count(prompt) and prompt.endswith("Question: Describe the various uses "
                                                                          "of forests to human beings?")
    prompt, n, source = make.summary_item(count, make.spec_bench_docs(spec_bench_path, "summarization"), 1000)
    assert abs(n - 1000) <= 20 and prompt.startswith("Below are news articles.")
    assert "summarization questions 241" in source
    stdlib = Path(make.sysconfig.get_paths()["stdlib"])
    prompt, n, source = make.code_item(count, stdlib, "textwrap.py", 1000)
    assert abs(n - 1000) <= 20 and "Lib/textwrap.py lines" in source
    name = re.search(r"the function `([\w.]+)`", prompt).group(1)
    assert prompt.rstrip().endswith(f"write the rest of `{name}`.")


# -- item 6: a prompt over the model's window --------------------------------------------------------

def test_a_prompt_past_the_window_is_refused(tiny_llama):
    from specbench.decoding.engine import Engine
    from specbench.errors import InputError
    from specbench.methods.ar import Autoregressive

    # 288 prompt tokens and 40 new on a model of 256 positions
    with pytest.raises(InputError, match="context"):
        Engine(tiny_llama, eos_token_ids=[]).generate(list(range(1, 97)) * 3, Autoregressive(), 40)


# -- task=dataset ------------------------------------------------------------------------------------

ROWS = [{"id": "a", "prompt": "What is two plus two?", "kind": "qa", "bucket": "short"},
        {"id": "b", "prompt": ["Write a haiku.", "Now another."], "kind": "writing", "bucket": "short"},
        {"id": "c", "prompt": "Summarize: the cat sat.", "kind": "summarization", "bucket": "tiny"}]
EXPECTED = [Question("a", "qa", ["What is two plus two?"], "short"),
            Question("b", "writing", ["Write a haiku.", "Now another."], "short"),
            Question("c", "summarization", ["Summarize: the cat sat."], "tiny")]
COLUMNS = {"turns": "prompt", "question_id": "id", "category": "kind", "subtask": "bucket"}


def as_lists(rows):
    """Arrow wants one type a column: every prompt a list."""
    return [dict(r, prompt=[r["prompt"]] if isinstance(r["prompt"], str) else r["prompt"]) for r in rows]


def write_formats(tmp: Path) -> dict[str, Path]:
    datasets.disable_progress_bars()
    paths = {"jsonl": tmp / "q.jsonl", "json": tmp / "q.json", "parquet": tmp / "q.parquet",
             "save_to_disk": tmp / "saved", "folder of jsonl": tmp / "parts"}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in as_lists(ROWS)))
    paths["json"].write_text(json.dumps(as_lists(ROWS)))  # one JSON array
    datasets.Dataset.from_list(as_lists(ROWS)).to_parquet(str(paths["parquet"]))
    datasets.Dataset.from_list(as_lists(ROWS)).save_to_disk(str(paths["save_to_disk"]))
    paths["folder of jsonl"].mkdir()
    for i, r in enumerate(as_lists(ROWS)):  # read in name order
        (paths["folder of jsonl"] / f"part-{i}.jsonl").write_text(json.dumps(r) + "\n")
    return paths


def test_every_format_maps_its_columns(tmp_path):
    for fmt, path in write_formats(tmp_path).items():
        assert load_dataset_questions(str(path), COLUMNS) == EXPECTED, fmt
    # through the task config, as python run.py task=dataset task.path=... task.columns.turns=... composes it
    task = cfg("task=dataset", f"task.path={tmp_path / 'q.parquet'}",
               *[f"task.columns.{k}={v}" for k, v in COLUMNS.items()], "task.subtasks=[tiny]")["task"]
    assert load_task(task) == EXPECTED[2:]


def test_a_turns_column_of_strings_and_the_defaults_of_unmapped_fields(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("one", "two")))
    assert load_dataset_questions(str(path), {"turns": "text"}) == [Question(0, "default", ["one"]),
                                                                    Question(1, "default", ["two"])]


def test_splits_of_a_saved_dataset_dict(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(as_lists(ROWS[:2])),
                               "test": datasets.Dataset.from_list(as_lists(ROWS[2:]))})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert load_dataset_questions(str(tmp_path / "dd"), COLUMNS, "test") == EXPECTED[2:]
    with pytest.raises(SettingsError, match=r"has the splits train, test; set task.split=<one of them>"):
        load_dataset_questions(str(tmp_path / "dd"), COLUMNS)


def test_spec_bench_loads_the_same_as_a_dataset(spec_bench_path):
    for extra in ({}, {"per_subtask": 2}, {"subtasks": ["rag", "mt"], "per_subtask": 1}):
        as_dataset = load_task(dict(cfg("task=dataset", f"task.path={spec_bench_path}")["task"], **extra))
        as_spec_bench = load_task(dict(cfg("task=spec_bench", f"task.path={spec_bench_path}")["task"], **extra))
        assert as_dataset == as_spec_bench and as_dataset
    assert load_dataset_questions(str(spec_bench_path)) == load_jsonl_questions(spec_bench_path)


@pytest.mark.parametrize("columns,message", [
    ({"turns": "text"}, r"names column\(s\) text, which .*q.jsonl does not have; its columns: id, prompt, kind, "
                        r"bucket"),
    ({"prompt": "prompt"}, r"task.columns names prompt, which is no field of a question; fields: turns, question_id"),
    ({}, r"has no column 'turns'; set task.columns.turns=<the column holding the prompts>; its columns: id, prompt"),
], ids=["missing column", "unknown field", "no turns"])
def test_bad_columns_are_refused_naming_the_columns(tmp_path, columns, message):
    path = write_formats(tmp_path)["jsonl"]
    with pytest.raises(SettingsError, match=message):
        load_dataset_questions(str(path), columns)


def test_bad_rows_are_refused_naming_the_row(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"id": 1, "text": "a"}) + "\n" + json.dumps({"id": 1, "text": "b"}) + "\n")
    with pytest.raises(SettingsError, match=r"q.jsonl row 1: duplicate question_id 1 \(first on row 0\)"):
        load_dataset_questions(str(path), {"turns": "text", "question_id": "id"})
    path.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": " "}) + "\n")
    with pytest.raises(SettingsError, match=r"q.jsonl row 1: question 1 has an empty turn"):
        load_dataset_questions(str(path), {"turns": "text"})
    path.write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(SettingsError, match=r"q.jsonl': cannot be read as json"):
        load_dataset_questions(str(path), {"turns": "text"})


def test_what_is_not_there_is_refused_offline_in_seconds(tmp_path, monkeypatch):
    with pytest.raises(MissingFileError, match="not found: give a local folder or file, or a hub id"):
        load_dataset_questions(str(tmp_path / "missing.jsonl"))
    with pytest.raises(MissingFileError, match="holds no dataset"):
        load_dataset_questions(str(tmp_path))

    def no_network(*args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(MissingFileError, match=r"task.path 'someone/some-set': no such local folder or file.*"
                                               r"save_to_disk\(<folder>\)"):
        load_dataset_questions("someone/some-set")


def test_a_bad_dataset_task_is_one_error_line_before_anything_loads(tmp_path, monkeypatch, capsys):
    from tests.test_bad_inputs import run_in_process

    path = write_formats(tmp_path)["jsonl"]
    code, err = run_in_process(["task=dataset", f"task.path={path}", "task.columns.turns=text",
                                f"results_root={tmp_path}/results"], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: task.columns names column(s) text"), err
    code, err = run_in_process(["task=dataset", f"results_root={tmp_path}/results"], monkeypatch, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "task.path" in err, err

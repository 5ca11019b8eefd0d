"""Spec-Bench answer files both ways (specbench/report/specbench_format.py).

A run directory made by hand: three questions (one MT-bench question with two turns, one
translation, one QA), AR answers interleaved, made-up token counts, times and accepted lengths.
Our figures (collect / tables / metrics) must equal the ones Spec-Bench's evaluation/speed.py
computes from the exported files, and export -> import -> export must give back the same files.
"""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbench.run import metrics
from specbench.report import collect, tables, specbench_format as sf

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "results"
SAMPLE_QUESTIONS = ROOT / "tests" / "fixtures" / "spec_bench_sample.jsonl"

# question_id, category, per turn (text, new_tokens, wall_time, prefill_time, accept_lengths)
METHOD = [
    (81, "writing", [("alpha beta gamma", 12, 0.5, 0.05, [3, 4, 1, 3]), ("delta epsilon", 7, 0.25, 0.04, [2, 4])]),
    (201, "translation", [("the train leaves at eight", 20, 1.25, 0.1, [5, 5, 4, 2, 3])]),
    (321, "qa", [("one hundred degrees", 9, 0.75, 0.07, [1, 2, 1, 4])]),
]
AR_TIMES = {81: (1.5, 0.5), 201: (2.0,), 321: (0.5,)}  # same texts and token counts, one token per step


def _record(qid, cat, turns, method):
    return {"question_id": qid, "category": cat, "subtask": "mt" if cat == "writing" else cat, "method": method,
            "turns": [{"output": text, "token_ids": list(range(n)), "new_tokens": n, "wall_time": wt,
                       "prefill_time": pt, "decoding_steps": len(acc), "accept_lengths": acc}
                      for text, n, wt, pt, acc in turns],
            "lossless": {"status": "exact"}}


def _ar_turns(qid, turns):
    return [(text, n, AR_TIMES[qid][i], 0.02, [1] * (n - 1)) for i, (text, n, _, _, _) in enumerate(turns)]


def make_run(root: Path, name="tr-t0-m32") -> Path:
    d = root / "toy" / "spec_bench" / name
    d.mkdir(parents=True)
    ident = {"model": "toy", "task": "spec_bench", "per_subtask": None, "max_new_tokens": 32, "temperature": 0,
             "top_k": 0, "top_p": 1.0, "dtype": "float32", "device": "cpu", "seed": 0, "method": "tr"}
    cfg = {"method": {"name": "tr"}, "baseline": "interleave", "repeat": 0, "device_name": "cpu"}
    (d / "run_config.json").write_text(json.dumps({"identity": ident, "config": cfg}))
    recs = [_record(q, c, t, "tr") for q, c, t in METHOD]
    base = [_record(q, c, _ar_turns(q, t), "ar") for q, c, t in METHOD]
    (d / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "baseline_answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))
    (d / "summary.json").write_text(json.dumps({"method": "tr", "method_params": {}, "model": "toy",
                                                "finished": "2026-01-02T03:04:05"}))
    return d


@pytest.fixture
def run_dir(tmp_path):
    return make_run(tmp_path / "results")


@pytest.fixture
def exported(run_dir, tmp_path):
    return sf.export_run(run_dir, tmp_path / "answers")


def _lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_export_layout_is_spec_bench_eval_py(exported):
    assert exported["answers"].name == "toy-tr-float32-temp-0.0.jsonl"
    assert exported["baseline"].name == "toy-vanilla-float32-temp-0.0.jsonl"
    first = _lines(exported["answers"])[0]
    assert list(first) == ["question_id", "category", "answer_id", "model_id", "choices", "tstamp"]
    c = first["choices"][0]
    assert list(c)[:6] == ["index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"]
    assert c["turns"] == ["alpha beta gamma", "delta epsilon"] and c["new_tokens"] == [12, 7]
    assert c["decoding_steps"] == [4, 2] and c["wall_time"] == [0.5, 0.25]
    assert c["accept_lengths"] == [3, 4, 1, 3, 2, 4]  # one flat list, as eval.py extends it turn after turn
    assert first["model_id"] == "toy-tr-float32-temp-0.0" and len(first["answer_id"]) == 22
    assert first["tstamp"] == pytest.approx(1767323045.0)  # the run's finish time, read as UTC
    assert [a["question_id"] for a in _lines(exported["baseline"])] == [81, 201, 321]


def test_export_is_reproducible(run_dir, exported, tmp_path):
    again = sf.export_run(run_dir, tmp_path / "again")
    assert again["answers"].read_bytes() == exported["answers"].read_bytes()
    assert again["baseline"].read_bytes() == exported["baseline"].read_bytes()


def test_speed_report_equals_our_figures(run_dir, exported):
    (ours,) = collect.run_rows([collect.load_run(run_dir)])
    rep = sf.specbench_speed_report(exported["answers"], exported["baseline"])
    assert list(rep) == ["mt_bench", "translation", "qa", "overall"]  # tasks with no question are left out
    for task, r in rep.items():
        sub = sf.TASK_TO_SUBTASK[task]
        assert r["speedup"] == pytest.approx(ours[sub])
        recs = collect.load_run(run_dir).records
        sel = recs if sub == "overall" else [x for x in recs if x["subtask"] == sub]
        assert r["mean_accepted_tokens"] == pytest.approx(metrics.mat(sel))
    assert rep["overall"]["tokens_per_second"] == pytest.approx(ours["tokens_per_s"])
    assert rep["overall"]["tokens_per_second_baseline"] == pytest.approx(ours["baseline_tokens_per_s"])
    assert rep["overall"]["mean_accepted_tokens"] == pytest.approx(ours["mat"])
    # by hand: method speeds 19/0.75, 20/1.25, 9/0.75; AR speeds 19/2, 20/2, 9/0.5
    assert ours["overall"] == pytest.approx((19 / 0.75 + 16 + 12) / (9.5 + 10 + 18))
    assert ours["mat"] == pytest.approx(sum([3, 4, 1, 3, 2, 4, 5, 5, 4, 2, 3, 1, 2, 1, 4]) / 15)


def test_speed_report_counts_baseline_tokens_by_retokenizing(exported):
    """speed.py counts the baseline's tokens as len(tokenizer(text).input_ids) - 1 per turn."""
    words = lambda text: SimpleNamespace(input_ids=["<s>"] + text.split())  # noqa: E731
    rep = sf.specbench_speed_report(exported["answers"], exported["baseline"], tokenizer=words)
    base = (5 / 2 + 5 / 2 + 3 / 0.5) / 3  # words: 3+2, 5, 3 over AR times 2, 2, 0.5
    assert rep["overall"]["tokens_per_second_baseline"] == pytest.approx(base)
    text = sf.format_speed_report(rep)
    assert "============================== Task:  overall ==============================" in text
    assert "#Mean accepted tokens:  " in text and "Speedup ratio:  " in text


def test_round_trip_gives_back_the_figures_and_the_files(run_dir, exported, tmp_path):
    out = sf.import_answers(exported["answers"], tmp_path / "imported", "tr", "toy", baseline=exported["baseline"],
                            device="cpu", max_new_tokens=32)
    assert out.name == "imported-tr-t0-m32"
    assert {p.name for p in out.iterdir()} == {"run_config.json", "answers.jsonl", "baseline_answers.jsonl",
                                              "summary.json"}
    orig, imp = collect.load_run(run_dir), collect.load_run(out)
    keys = ("output", "new_tokens", "wall_time", "prefill_time", "decoding_steps", "accept_lengths")
    for a, b in zip(orig.records + orig.baseline, imp.records + imp.baseline, strict=True):
        assert (a["question_id"], a["category"], a["subtask"]) == (b["question_id"], b["category"], b["subtask"])
        assert [{k: t[k] for k in keys} for t in a["turns"]] == [{k: t[k] for k in keys} for t in b["turns"]]
    (row_o,) = collect.run_rows([orig])
    (row_i,) = collect.run_rows([imp])
    for k in (*tables.VALUE_KEYS, "decode_tokens_per_s", "decode_speedup", "baseline_tokens_per_s", "questions"):
        assert row_i[k] == row_o[k], k
    assert row_i["lossless"] == {"checked": 3, "exact": 3, "numeric_ties": 0, "mismatches": 0, "lossy_differences": 0,
                                 "tokens_checked": 0, "tokens_equal": 0, "tokens_numeric": 0, "tokens_outside_band": 0,
                                 "questions_outside_band": 0}
    assert imp.records[0]["lossless"] == {"status": "exact", "basis": "text"}
    assert (row_i["model"], row_i["temperature"], row_i["dtype"]) == ("toy", 0.0, "float32")  # from the model id
    summary = json.loads((out / "summary.json").read_text())
    assert summary["source"]["kind"] == "imported" and summary["source"]["answers"] == str(exported["answers"])
    assert summary["speedup"]["overall"] == pytest.approx(row_o["overall"])
    again = sf.export_run(out, tmp_path / "again")
    assert again["answers"].read_bytes() == exported["answers"].read_bytes()
    assert again["baseline"].read_bytes() == exported["baseline"].read_bytes()


def test_collect_and_tables_show_an_imported_run_beside_ours(exported, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(FIXTURE, root)
    sf.import_answers(exported["answers"], root, "eagle", "smollm2-135m", baseline=exported["baseline"],
                      task="mini", device="cpu", max_new_tokens=32)
    runs = collect.load_runs(root)
    rows = collect.run_rows(runs)
    eagle = [r for r in rows if r["method"] == "eagle"]
    assert len(rows) == 6 and len(eagle) == 1 and eagle[0]["overall"] == pytest.approx((19 / 0.75 + 28) / 37.5)
    md = tables.to_markdown(tables.build_tables(tables.aggregate(rows)))
    table = md.split("### ")[1]
    assert table.startswith("smollm2-135m · mini · T=0 · 32 new tokens · float32 · cpu")
    assert "| eagle |" in table and "| tr |" in table and "eagle 3/3 valid, 3 exact vs AR" in table
    fr = collect.frames(runs)
    assert (fr["questions"]["method"] == "eagle").sum() == 3
    assert collect.write_results_csv(root).is_file()


def test_export_finds_the_shared_ar_directory(tmp_path):
    runs = FIXTURE / "smollm2-135m" / "mini"
    for name in ("ar-t0-m32", "tr-t0-m32"):
        shutil.copytree(runs / name, tmp_path / name)
    (tmp_path / "tr-t0-m32" / "baseline_answers.jsonl").unlink()
    paths = sf.export_run(tmp_path / "tr-t0-m32", tmp_path / "out")
    rep = sf.specbench_speed_report(paths["answers"], paths["baseline"])
    assert rep["overall"]["speedup"] == pytest.approx(1.875) and rep["qa"]["speedup"] == pytest.approx(2.0)
    ar = sf.export_run(tmp_path / "ar-t0-m32", tmp_path / "out_ar")  # AR is its own baseline: one file
    assert ar["baseline"] is None and ar["answers"].name == "smollm2-135m-vanilla-float32-temp-0.0.jsonl"


def _foreign_line(qid, turns, new_tokens, steps, accepts, **extra):
    return json.dumps({"question_id": qid, "answer_id": f"a{qid}", "model_id": "vicuna-7b-v1.3-sps-68m-float16",
                       "choices": [{"index": 0, "turns": turns, "decoding_steps": steps, "new_tokens": new_tokens,
                                    "wall_time": [0.5] * len(turns), "accept_lengths": accepts}],
                       "tstamp": 1700000000.5, **extra}) + "\n"


def test_foreign_files_categories_from_question_file_and_unsplittable_accepts(tmp_path):
    # SpS reports idx+1 steps: they do not add up to the accepted lengths, so the split is unknown
    meth = tmp_path / "sps.jsonl"
    meth.write_text(_foreign_line(81, ["A", "B"], [6, 4], [3, 3], [2, 2, 2, 2, 2])
                    + _foreign_line(82, ["C", "D"], [4, 4], [2, 2], [2, 2, 2, 2]))
    base = tmp_path / "base.jsonl"
    base.write_text(_foreign_line(81, ["A", "B"], [6, 4], [6, 4], [1] * 10)
                    + _foreign_line(82, ["C", "X"], [4, 4], [4, 4], [1] * 8))
    out = sf.import_answers(meth, tmp_path / "r", "sps", "vicuna-7b", baseline=base, questions=SAMPLE_QUESTIONS)
    run = collect.load_run(out)
    assert [r["category"] for r in run.records] == ["writing", "writing"]  # from the question file
    r81 = run.records[0]
    assert r81["turns"][0]["accept_lengths"] == [2] * 5 and r81["turns"][1]["accept_lengths"] == []
    assert r81["specbench"]["accept_lengths_split"] == "unknown"
    assert run.records[1]["turns"][0]["accept_lengths"] == [2, 2] and "accept_lengths_split" not in run.records[1]["specbench"]
    assert run.records[1]["lossless"] == {"status": "text_differs", "basis": "text", "turn": 1, "char_position": 0}
    (row,) = collect.run_rows([run])
    assert row["mat"] == 2.0 and row["decode_tokens_per_s"] is None and row["decode_speedup"] is None
    assert (row["temperature"], row["dtype"]) == (0.0, "float16")
    assert row["lossless"]["checked"] == 2 and row["lossless"]["exact"] == 1
    assert row["overall"] == pytest.approx(1.0)
    with pytest.raises(sf.FormatError, match="sps.jsonl:1: no category"):  # speed.py needs it in the lines
        sf.specbench_speed_report(meth, base)


def test_method_file_alone(tmp_path):
    meth = tmp_path / "m.jsonl"
    meth.write_text(_foreign_line(201, ["x"], [5], [2], [3, 2], category="translation"))
    out = sf.import_answers(meth, tmp_path / "r", "hydra", "vicuna-7b", temperature=0.7)
    assert out.name == "imported-hydra-t0.7" and not (out / "baseline_answers.jsonl").exists()
    s = json.loads((out / "summary.json").read_text())
    assert s["speedup"] is None and s["lossless"]["checked"] == 0 and s["temperature"] == 0.7
    (row,) = collect.run_rows([collect.load_run(out)])
    assert row["overall"] is None and row["mat"] == 2.5
    assert tables.build_tables(tables.aggregate([row]))[0]["rows"][0]["label"] == "hydra"
    with pytest.raises(FileExistsError):
        sf.import_answers(meth, tmp_path / "r", "hydra", "vicuna-7b", temperature=0.7)


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"choices": []}', "missing field question_id"),
    ('{"question_id": 1, "choices": []}', "'choices' must be a non-empty list"),
    ('{"question_id": 1, "choices": [{"turns": ["a"]}]}', "lacks decoding_steps, new_tokens, wall_time, accept_lengths"),
    (_foreign_line(1, ["a", "b"], [3], [1, 1], [1, 1]).strip(), "new_tokens must be 2 non-negative"),
    (_foreign_line(1, ["a"], [3], [1], ["x"]).strip(), "accept_lengths must be a list of numbers"),
])
def test_malformed_files_name_file_and_line(tmp_path, line, message, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_foreign_line(81, ["A"], [2], [1], [2], category="writing") + line + "\n")
    with pytest.raises(sf.FormatError, match=message) as e:
        sf.read_answer_file(bad)
    assert str(e.value).startswith(f"{bad}:2: ")
    from scripts.import_specbench import main

    assert main(["--answers", str(bad), "--method", "m", "--model", "x", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {bad}:2: ")


def test_missing_category_without_question_file(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text(_foreign_line(99999, ["A"], [2], [1], [2]))
    with pytest.raises(sf.FormatError, match=r"a.jsonl:1: question 99999 has no category"):
        sf.import_answers(f, tmp_path / "r", "m", "x", questions=SAMPLE_QUESTIONS)


def test_scripts(run_dir, tmp_path, capsys):
    from scripts.export_specbench import main as export_main
    from scripts.import_specbench import main as import_main

    assert export_main([str(run_dir), "--out", str(tmp_path / "a"), "--report"]) == 0
    out = capsys.readouterr().out
    assert "toy-tr-float32-temp-0.0.jsonl" in out and "Task:  mt_bench" in out
    a, b = tmp_path / "a" / "toy-tr-float32-temp-0.0.jsonl", tmp_path / "a" / "toy-vanilla-float32-temp-0.0.jsonl"
    assert import_main(["--answers", str(a), "--baseline", str(b), "--method", "tr", "--model", "toy",
                        "--out", str(tmp_path / "r"), "--questions", str(SAMPLE_QUESTIONS)]) == 0
    assert "3 questions, MAT 2.93, speedup" in capsys.readouterr().out
    assert export_main([str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2

"""Leaderboard tables from the hand-made fixture (tests/fixtures/make_results_fixture.py)."""

import csv
import io
import json
from pathlib import Path
from statistics import stdev

import pytest

from specbench.report import collect, tables
from specbench.run import metrics

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "results"
RUNS = FIXTURE / "smollm2-135m" / "mini"


@pytest.fixture(scope="module")
def rows():
    return {Path(r["path"]).name: r for r in collect.run_rows(collect.load_runs(FIXTURE))}


def test_speedup_is_ratio_of_mean_speeds_overall_over_all_questions(rows):
    tr = rows["tr-t0-m32"]
    assert tr["qa"] == pytest.approx(2.0)  # mean(30, 30) / mean(10, 20), not mean(3, 1.5) = 2.25
    assert tr["overall"] == pytest.approx(150 / 80)  # all questions, not the mean of subtask speedups
    assert tr["mt"] == pytest.approx(2.0) and tr["rag"] == pytest.approx(1.0)
    assert tr["tokens_per_s"] == pytest.approx(150 / 7)
    assert tr["baseline_tokens_per_s"] == pytest.approx(80 / 7)
    # MAT pools every step: 6 questions (mt has 2 turns) of 10x3 + 1x1, qa-2 3x1 + 4x5 + 4x3
    assert tr["mat"] == pytest.approx((7 * 31 + 35) / (7 * 11 + 11))
    ar = rows["ar-t0-m32"]
    assert ar["mat"] == 1 and ar["overall"] == 1 and ar["tokens_per_s"] == pytest.approx(80 / 7)


def test_repeats_are_averaged_with_sample_std(rows):
    agg = {(r["method"], r["temperature"]): r for r in tables.aggregate(list(rows.values()))}
    tr = agg[("tr", 0.0)]
    assert tr["n"] == 2 and tr["repeats"] == [0, 1]
    assert tr["overall"] == pytest.approx((1.875 + 2.25) / 2)
    assert tr["overall_std"] == pytest.approx(stdev([1.875, 2.25]))
    assert agg[("pld", 0.0)]["n"] == 1 and agg[("pld", 0.0)]["overall_std"] is None


def test_markdown_layout(rows):
    md = tables.to_markdown(tables.build_tables(tables.aggregate(list(rows.values()))))
    lines = md.splitlines()
    assert lines[0] == "### smollm2-135m · mini · T=0 · 32 new tokens · float32 · cpu"
    assert lines[2] == ("| Method | MT | Translation | Summarization | QA | Math | RAG | MAT | Acc. rate | tokens/s "
                        "| Overall | 95% CI |")
    body = [ln for ln in lines[4:7]]
    assert [b.split(" | ")[0] for b in body] == ["| ar", "| tr", "| pld"]  # AR first, then best overall
    assert body[0] == "| ar | 1.00x | 1.00x | 1.00x | 1.00x | 1.00x | 1.00x | 1.00 | - | 11.4 | 1.00x | [1.00, 1.00] |"
    # TR accepts 164 of 8 turns x 110 drafted nodes; repeats show ± std and one interval over both runs,
    # each resample taking a question's two runs together
    runs = [r["question_speeds"] for r in rows.values() if r["method"] == "tr" and r["temperature"] == 0]
    lo, hi = metrics.repeated_speedup_ci(runs)
    assert len(runs) == 2 and lo < (1.875 + 2.25) / 2 < hi
    assert "| 18.6% ± 0.0% |" in body[1] and body[1].endswith(f"| 2.06x ± 0.27 | [{lo:.2f}, {hi:.2f}] |")
    assert "a question's runs resampled together" in md
    assert "| 1.48 | 6.7% | 15.1 | 1.32x | [0.84, 2.00] |" in body[2]  # PLD: 10 of 15 x 10 drafted
    t07 = md.split("T=0.7")[1]
    # an older run, no step_drafted: no rate, the rest as before
    assert "| tr | 1.60x | 1.20x | 2.00x | 1.60x | 1.60x | 0.80x | 2.86 | - | 17.1 | 1.50x | [1.20, 1.89] |" in t07
    assert "n=2" in md and "### smollm2-135m · mini · T=0.7" in md
    assert "| ar (interleaved) |" in md  # T=0.7 has no AR run: AR row from the methods' references


def test_latex_and_csv(rows):
    built = tables.build_tables(tables.aggregate(list(rows.values())))
    tex = tables.to_latex(built)
    assert tex.count("\\begin{tabular}") == 2 and "\\toprule" in tex and "$\\pm$" in tex
    assert ("MT & Translation & Summarization & QA & Math & RAG & MAT & Acc. rate & tokens/s & Overall & 95\\% CI"
            in tex)
    recs = list(csv.DictReader(io.StringIO(tables.to_csv(built))))
    tr = [r for r in recs if r["method"] == "tr" and r["temperature"] == "0.0"][0]
    assert float(tr["overall"]) == pytest.approx(2.0625) and tr["n"] == "2"
    pld = [r for r in recs if r["method"] == "pld"][0]
    assert float(pld["accept_rate"]) == pytest.approx(10 / 150) and float(pld["speedup_ci_lo"]) < float(pld["overall"])


def test_published_side_by_side():
    published = collect.load_published(ROOT / "results" / "published")
    assert {p["source"] for p in published} == {"TR paper, A100", "Spec-Bench board, A100"}
    ours = [dict(model="vicuna-7b", task="spec_bench", temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=1024,
                 dtype="float16", device="cuda", method=m, method_params={}, repeat=0, lossless=None,
                 **{k: v for k in tables.VALUE_KEYS}) for m, v in (("ar", 1.0), ("tr", 2.0))]
    ours[0]["tokens_per_s"] = 50.0
    (table,) = tables.build_tables(tables.aggregate(ours), published)
    labels = [(r["label"], r["source"]) for r in table["rows"]]
    assert labels == [("ar", "ours"), ("ar", "TR paper, A100"),
                      ("tr", "ours"), ("tr", "Spec-Bench board, A100"), ("tr", "TR paper, A100")]
    tr_paper = table["rows"][4]
    assert tr_paper["overall"] == 2.03 and tr_paper["mat"] == 2.70 and tr_paper["tokens_per_s"] == 110.06
    md = tables.to_markdown([table])
    assert ("| tr [TR paper, A100] | 2.17x | 1.90x | 1.94x | 1.95x | 2.40x | 1.78x | 2.70 | - | 110.1 | 2.03x | - |"
            in md)
    assert "| tr [Spec-Bench board, A100] |" in md and "| - | 2.22x |" in md  # the board has no tokens/s
    # sampling runs, and other models, get no published rows
    hot = [dict(r, temperature=0.7) for r in ours]
    assert all(r["source"] == "ours" for r in tables.build_tables(tables.aggregate(hot), published)[0]["rows"])
    assert tables.normalize_model("lmsys/vicuna-7b-v1.3") == tables.normalize_model("vicuna-7b")
    assert tables.published_for(published, "smollm2-135m", "tr", 0.0) == []


def test_method_variants_are_labelled_by_their_differing_params():
    base = dict(model="m", task="t", temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=8, dtype="f",
                device="cpu", method="tr", repeat=0, **{k: 1.0 for k in tables.VALUE_KEYS})
    rows = [dict(base, method_params={"k": 4, "tree": "published"}), dict(base, method_params={"k": 8, "tree": "published"})]
    labels = sorted(r["label"] for r in tables.build_tables(tables.aggregate(rows))[0]["rows"])
    assert labels == ["tr (k=4)", "tr (k=8)"]


def test_format_value():
    assert tables.format_value("qa", 2.0) == "2.00x"
    assert tables.format_value("qa", 2.0, 0.123) == "2.00x ± 0.12"
    assert tables.format_value("mat", 2.5) == "2.50" and tables.format_value("tokens_per_s", 110.06) == "110.1"
    assert tables.format_value("overall", None) == "-"


def test_make_tables_script_writes_every_format_and_results_csv(tmp_path, capsys):
    from scripts.make_tables import main

    assert main([str(FIXTURE), "--out", str(tmp_path)]) == 0
    assert "| Method | MT |" in capsys.readouterr().out
    for name in ("tables.md", "tables.tex", "tables.csv", "results.csv"):
        assert (tmp_path / name).stat().st_size > 0
    recs = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(recs) == 5 and {r["method"] for r in recs} == {"ar", "tr", "pld"}
    assert sorted(r["repeat"] for r in recs if r["method"] == "tr" and r["temperature"] == "0.0") == ["0", "1"]


def test_baseline_found_in_shared_ar_directory(tmp_path):
    """baseline=shared / reuse runs have no baseline_answers.jsonl: AR comes from the ar-... sibling."""
    import shutil

    for name in ("ar-t0-m32", "tr-t0-m32"):
        shutil.copytree(RUNS / name, tmp_path / name)
    (tmp_path / "tr-t0-m32" / "baseline_answers.jsonl").unlink()
    run = collect.load_run(tmp_path / "tr-t0-m32")
    assert len(run.baseline) == 7
    (row,) = collect.run_rows([run])
    assert row["overall"] == pytest.approx(1.875)


# -- a task with subtasks of its own: task=long's input-length buckets ------------------------------

BUCKETS = {"1k": 1000, "2k": 2000, "4k": 4000, "8k": 7500}  # subtask -> input tokens of its prompts
BUCKET_SPEEDUP = {"pld": {"1k": 2.0, "2k": 1.5, "4k": 1.25, "8k": 1.0},
                  "tr": {"1k": 1.0, "2k": 1.0, "4k": 0.5, "8k": 0.5}}


def bucket_record(qid, sub, method, speed, input_tokens):
    steps, accept, drafted = (15, 1, 0) if method == "ar" else (8, 2, 4)  # PLD's and TR's: every step 1 of 4
    turn = {"output": "x", "token_ids": list(range(16)), "new_tokens": 16, "wall_time": 16 / speed,
            "prefill_time": 4 / speed, "decoding_steps": steps, "accept_lengths": [accept] * steps,
            "step_drafted": [drafted] * steps, "input_tokens": input_tokens,
            "kv_cache_bytes": 46080 * (input_tokens + 15), "drafter_state_bytes": 400}  # SmolLM2: 46080 bytes a token
    return {"question_id": qid, "category": "long-prose", "subtask": sub, "method": method, "turns": [turn],
            "lossless": {"status": "exact"}}


def write_bucket_root(root: Path) -> Path:
    """A results root of task=long as the runner lays it out: AR and two methods, two prompts per bucket
    (their input tokens 10 apart), AR at 10 tok/s, each method at its BUCKET_SPEEDUP."""
    ident = {"model": "smollm2-135m", "model_path": None, "task": "long", "task_path": None, "per_subtask": 2,
             "max_new_tokens": 16, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "dtype": "float32", "device": "cpu",
             "seed": 0}
    questions = [(f"long-prose-{b}-{i}", b, n + 10 * i) for b, n in BUCKETS.items() for i in (0, 1)]
    for method in ("ar", "pld", "tr"):
        d = root / "smollm2-135m" / "long-ps2" / f"{method}-t0-m16"
        d.mkdir(parents=True)
        cfg = {"method": {"name": method}, "baseline": "interleave", "repeat": 0, "device_name": "cpu"}
        (d / "run_config.json").write_text(json.dumps({"identity": ident, "config": cfg}))
        speed = lambda b: 10.0 * BUCKET_SPEEDUP.get(method, {}).get(b, 1.0)  # noqa: E731
        recs = [bucket_record(q, b, method, speed(b), n) for q, b, n in questions]
        (d / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        if method != "ar":
            base = [bucket_record(q, b, "ar", 10.0, n) for q, b, n in questions]
            (d / "baseline_answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))
    return root


def test_buckets_are_the_columns_of_their_table(tmp_path):
    rows = collect.run_rows(collect.load_runs(write_bucket_root(tmp_path)))
    pld = [r for r in rows if r["method"] == "pld"][0]
    assert pld["subtasks"] == ["1k", "2k", "4k", "8k"]
    assert pld["subtask_speedup"] == pytest.approx(BUCKET_SPEEDUP["pld"])
    assert pld["subtask_input_tokens"] == pytest.approx({b: n + 5 for b, n in BUCKETS.items()})
    assert pld["mt"] is None and pld["overall"] == pytest.approx((20 + 15 + 12.5 + 10) / 4 / 10)
    built = tables.build_tables(tables.aggregate(rows))
    md = tables.to_markdown(built).splitlines()
    assert md[2] == "| Method | 1k | 2k | 4k | 8k | MAT | Acc. rate | tokens/s | Overall | 95% CI |"
    assert md[4].startswith("| ar | 1.00x | 1.00x | 1.00x | 1.00x | 1.00 |")
    assert md[5].startswith("| pld | 2.00x | 1.50x | 1.25x | 1.00x | 2.00 | 25.0% |")
    assert "1k & 2k & 4k & 8k & MAT" in tables.to_latex(built)
    recs = list(csv.DictReader(io.StringIO(tables.to_csv(built))))
    assert "mt" not in recs[0] and float(recs[1]["speedup_4k"]) == pytest.approx(1.25)


def test_make_tables_on_buckets_and_spec_bench_side_by_side(tmp_path, capsys):
    """One root holding both: each table its own columns; results.csv keeps Spec-Bench's and adds the buckets'."""
    import shutil

    from scripts.make_tables import main

    write_bucket_root(tmp_path / "root")
    shutil.copytree(RUNS, tmp_path / "root" / "smollm2-135m" / "mini")
    assert main([str(tmp_path / "root"), "--out", str(tmp_path), "--published", ""]) == 0
    heads = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| Method |")]
    assert heads[0].startswith("| Method | 1k | 2k | 4k | 8k | MAT |") and heads[1].startswith("| Method | MT |")
    recs = list(csv.DictReader((tmp_path / "results.csv").open()))
    fields = list(recs[0])
    assert fields[fields.index("rag") + 1:fields.index("overall")] == ["speedup_1k", "speedup_2k", "speedup_4k",
                                                                      "speedup_8k"]
    tr_long = [r for r in recs if r["method"] == "tr" and r["task"] == "long-ps2"][0]
    assert float(tr_long["speedup_8k"]) == pytest.approx(0.5) and tr_long["mt"] == ""
    tables_csv = list(csv.DictReader((tmp_path / "tables.csv").open()))
    assert {"mt", "speedup_1k"} <= set(tables_csv[0])
    # the Spec-Bench root alone keeps the leaderboard's layout (the committed tables are made this way)
    assert tables.csv_fields(tables.csv_subtasks(tables.build_tables(tables.aggregate(collect.run_rows(
        collect.load_runs(FIXTURE)))))) == tables.CSV_FIELDS
    assert collect.results_csv_fields(collect.run_rows(collect.load_runs(FIXTURE))) == collect.RESULTS_CSV_FIELDS

from specbench.run.results_io import append_jsonl, read_jsonl, repair_jsonl


def test_append_and_repair_torn_line(tmp_path):
    p = tmp_path / "answers.jsonl"
    append_jsonl(p, {"question_id": 1})
    append_jsonl(p, {"question_id": 2})
    with p.open("a") as f:
        f.write('{"question_id": 3, "tur')  # a crash mid-write
    assert [r["question_id"] for r in read_jsonl(p)] == [1, 2]
    assert [r["question_id"] for r in repair_jsonl(p)] == [1, 2]
    append_jsonl(p, {"question_id": 3})
    assert [r["question_id"] for r in read_jsonl(p)] == [1, 2, 3]

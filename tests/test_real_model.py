"""The engine on the embedded real model (SmolLM2-135M-Instruct): AR equals transformers' greedy
generate, a tree forward equals sequential forwards, and whole runs write, resume and reproduce.
(Every method against AR: tests/test_lossless_methods.py.)"""

import json

import pytest
import torch

from specbench.inputs.chat import prompt_ids
from specbench.draft import Draft
from specbench.decoding.engine import Engine
from specbench.decoding.kv_cache import with_cache
from specbench.inputs.tasks import load_jsonl_questions, select_per_subtask
from specbench.draft import DraftTree
from transformers import DynamicCache


@pytest.fixture(scope="module")
def prompts(real_model, spec_bench_path):
    _, tok, _ = real_model
    qs = select_per_subtask(load_jsonl_questions(spec_bench_path), 1)
    return {q.subtask: prompt_ids(tok, [{"role": "user", "content": q.turns[0]}]) for q in qs}


def test_ar_equals_transformers_generate(real_model, prompts, ar_tokens):
    model, _, eos = real_model
    for sub in ("qa", "translation"):
        ids = prompts[sub]
        ours = ar_tokens(ids, 32)
        ref = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
        assert ours == ref, sub


def test_published_tree_forward_matches_sequential(real_model, prompts):
    model, _, eos = real_model
    from specbench.drafting.recycling import PUBLISHED_TREE

    tree = DraftTree.from_children_counts(PUBLISHED_TREE)
    ids = prompts["qa"]
    g = torch.Generator().manual_seed(0)
    draft = Draft(tokens=torch.randint(0, 49152, (len(tree),), generator=g), tree=tree)
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([ids[:-1]]), **with_cache(model, cache), use_cache=True)
    logits, _ = Engine(model, eos).forward_rows(cache, len(ids) - 1, draft, ids[-1])
    toks = draft.tokens.tolist()
    for node in (0, 1, 9, 30, 57, 80):  # the root and nodes at depths 1..6
        path = [toks[n - 1] for n in tree.path_to(node)] if node else []
        with torch.no_grad():
            expect = model(input_ids=torch.tensor([ids + path])).logits[0, -1]
        torch.testing.assert_close(logits[node], expect, atol=2e-4, rtol=1e-4)


def test_run_writes_answers_summary_and_resumes(real_model, tmp_path, capsys):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench.main import run_benchmark
    from tests.test_config import CONF

    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = OmegaConf.to_container(compose("config", overrides=[
            "task.limit=2", "max_new_tokens=8", "warmup=1", f"results_dir={tmp_path}", "progress=false"]),
            resolve=True)
    summary = run_benchmark(cfg)
    assert summary["questions"] == 2 and summary["lossless"]["mismatches"] == 0
    assert summary["lossless"]["checked"] == 2
    assert set(summary["speedup"]) == {"overall", "mt"}
    for key in ("tokens_per_s", "mat", "baseline_tokens_per_s", "decode_tokens_per_s", "new_tokens"):
        assert summary[key] > 0
    lines = (tmp_path / "answers.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    assert {"question_id", "category", "subtask", "turns"} <= set(rec)
    assert {"output", "token_ids", "new_tokens", "wall_time", "decoding_steps", "accept_lengths"} <= set(rec["turns"][0])
    assert len(rec["turns"]) == 2  # MT-bench questions have two turns
    assert "| tr " in capsys.readouterr().out
    # a rerun finds every question done and recomputes the same summary without new lines
    again = run_benchmark(cfg)
    assert (tmp_path / "answers.jsonl").read_text().splitlines() == lines
    assert again["new_tokens"] == summary["new_tokens"]


def test_run_at_temperature_is_exact_and_reproducible(real_model, tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench.main import run_benchmark
    from tests.test_config import CONF

    def run(d):
        with initialize_config_dir(config_dir=CONF, version_base=None):
            cfg = OmegaConf.to_container(compose("config", overrides=[
                "task.limit=1", "max_new_tokens=8", "warmup=0", "temperature=0.7", "top_p=0.9",
                "cost_curve=off", f"results_dir={d}", "progress=false"]), resolve=True)
        return run_benchmark(cfg)

    s = run(tmp_path / "a")
    assert s["temperature"] == 0.7 and s["top_p"] == 0.9
    assert s["lossless"] == {"questions": 1, "checked": 1, "exact": 1, "numeric_ties": 0, "mismatches": 0, "lossy_differences": 0,
                             "tokens_checked": 16, "tokens_equal": 16, "tokens_numeric": 0, "tokens_outside_band": 0,
                                 "questions_outside_band": 0}
    a = [json.loads(x)["turns"][0]["token_ids"] for x in (tmp_path / "a" / "answers.jsonl").read_text().splitlines()]
    run(tmp_path / "b")  # same seed, fresh process state: the same samples
    b = [json.loads(x)["turns"][0]["token_ids"] for x in (tmp_path / "b" / "answers.jsonl").read_text().splitlines()]
    assert a == b

"""Broken verifiers the lossless check must catch (issue 45), on the embedded real model in bfloat16 and
float16 under the band measured for this machine (specbench/run/rounding_band.py):

- a verifier that takes AR's runner-up whenever it lies within 1.0, 0.5 or 0.25 logits of the top;
- a verifier always one rank off;
- the honest verifier, which must pass.

'Fails' is what makes a run exit 1: a token outside the measured band, a referee 'mismatch', or more
numeric tokens than lossless.max_numeric_share allows. In bfloat16 the measured rounding noise on a
margin (teacher-forced vs step by step: ~0.4 logits on this CPU) is wider than 0.25 logits, so there no
single token can tell such a verifier from rounding: the share of numeric tokens does.

Plus the run-level rules: the numeric share limit, fewer questions checked than asked, unequal turns.
"""

from __future__ import annotations

import platform

import pytest
import torch

from specbench.run import lossless
from specbench.config import LosslessConfig
from specbench.run.rounding_band import load_or_measure, row_band
from specbench.main import main_exit_code
from specbench.decoding.engine import Engine
from specbench.decoding.verify import accepted_path
from specbench.inputs.chat import prompt_ids
from specbench.inputs.models import eos_token_ids, load_model, named_model_config
from specbench.registry import build_drafter

PROMPTS = ["List three primary colours, one per line.", "Write a short story about a robot learning to paint.",
           "What is 17 * 23? Explain step by step."]
NEW_TOKENS = 32
LIMIT = LosslessConfig().max_numeric_share
_VERIFY = Engine._verify


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One thread: a half-precision forward on a busy 2-core machine is many times slower with two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_SETUP: dict = {}


def setup_for(dtype: str, real_model):
    """(model, eos, prompts' ids, AR's outputs, the measured band) in `dtype`, once per module."""
    if dtype not in _SETUP:
        tok = real_model[1]
        model, _ = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), getattr(torch, dtype))
        eos = eos_token_ids(model, tok)
        device_name = f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"
        band = load_or_measure(model, tok, "smollm2-135m", device_name, dtype)  # cached after the first
        ids = [prompt_ids(tok, [{"role": "user", "content": p}]) for p in PROMPTS]
        ar = [Engine(model, eos).generate(i, build_drafter("ar"), NEW_TOKENS).tokens for i in ids]
        _SETUP[dtype] = (model, eos, ids, ar, band)
    return _SETUP[dtype]


def _emit(self, logits, draft, draft_ids, targets):
    """What Engine._verify returns, for the given per-row targets (the rule of the broken verifiers)."""
    path = accepted_path(self.tree_tensors(draft.tree), draft_ids[1:draft.tree.size], targets)
    host = torch.cat([path, targets[path]]).tolist()
    depth = len(path)
    accepted = [a for a in host[1:depth] if a]
    return accepted, host[depth:depth + len(accepted) + 1], path


def runner_up_within(delta: float):
    """A verifier that takes the runner-up whenever it lies within `delta` logits of the top."""
    def verify(self, logits, draft, draft_ids, cache_len, select, drafter):
        if draft is None:
            return _VERIFY(self, logits, draft, draft_ids, cache_len, select, drafter)
        top = logits[:draft.tree.size].float().topk(2, dim=-1)
        gap = top.values[:, 0] - top.values[:, 1]
        near = (gap > 0) & (gap <= delta)  # an exact tie's 'runner-up' is as good as the top
        verify.fired += int(near.sum())
        return _emit(self, logits, draft, draft_ids, torch.where(near, top.indices[:, 1], top.indices[:, 0]))
    verify.fired = 0
    return verify


def one_rank_off(self, logits, draft, draft_ids, cache_len, select, drafter):
    """A verifier always one rank off: every target is the row's second choice."""
    if draft is None:
        return _VERIFY(self, logits, draft, draft_ids, cache_len, select, drafter)
    one_rank_off.fired += draft.tree.size
    return _emit(self, logits, draft, draft_ids, logits[:draft.tree.size].topk(2, dim=-1).indices[:, 1])


one_rank_off.fired = 0


def run_and_check(dtype: str, real_model, verifier, monkeypatch) -> dict:
    """TR with a small tree (every step verified) on the prompts under `verifier`; every output checked
    as a run checks it, under the measured band. Returns the run's tally, the verdicts and the band.
    A broken verifier stops at the first question that already fails the run on its own (a token
    outside the band or a referee mismatch): the rest could not make it pass, only slow the suite."""
    model, eos, ids, ar, band = setup_for(dtype, real_model)
    vocab = model.get_output_embeddings().weight.shape[0]
    if verifier is not None:
        monkeypatch.setattr(Engine, "_verify", verifier)
    checks = []
    for prompt, ar_out in zip(ids, ar):
        tr = build_drafter("tr", vocab_size=vocab, tree=[[4], [2, 2, 1, 1]])
        out = Engine(model, eos).generate(prompt, tr, NEW_TOKENS).tokens
        rec = {"turns": [{"prompt_ids": prompt, "token_ids": out}]}
        verdict = lossless.compare_question(model, {"turns": [{"prompt_ids": prompt, "token_ids": ar_out}]}, rec,
                                            dtype, band=band)
        verdict["tokens"] = lossless.check_tokens(model, rec, dtype, band=band)
        checks.append(verdict)
        if verifier is not None and (verdict["status"] == "mismatch" or verdict["tokens"]["tokens_outside_band"]):
            break
    monkeypatch.undo()
    lo = lossless.tally(checks, len(checks))
    summary = {"lossless": lo, "lossless_method": True}
    return {"lo": lo, "checks": checks, "band": band,
            "exit": main_exit_code(summary, {"lossless": {"check": True, "fail_on_mismatch": True,
                                                          "max_numeric_share": LIMIT}})}


def how_it_failed(r: dict) -> list[str]:
    lo = r["lo"]
    out = []
    if lo["tokens_outside_band"]:
        out.append(f"{lo['tokens_outside_band']} tokens outside the band")
    if lo["mismatches"]:
        out.append(f"{lo['mismatches']} referee mismatch(es)")
    if lossless.numeric_share_exceeded(lo, LIMIT):
        out.append(f"numeric share {lo['tokens_numeric']}/{lo['tokens_checked']}")
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_measured_band_is_tighter_than_the_assumed_one(dtype, real_model):
    band = setup_for(dtype, real_model)[4]
    assert 0 < band["band_ulps"] < lossless.BAND_ULPS[dtype], band
    assert row_band(band, 20.0, dtype) < lossless.rounding_band(20.0, dtype)
    assert row_band(None, 20.0, dtype) == lossless.rounding_band(20.0, dtype)  # the fallback


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_honest_verifier_passes(dtype, real_model, monkeypatch):
    r = run_and_check(dtype, real_model, None, monkeypatch)
    assert r["exit"] == 0 and not how_it_failed(r), (r["lo"], r["checks"])
    assert r["lo"]["checked"] == len(PROMPTS)


@pytest.mark.parametrize("delta", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_verifier_taking_the_runner_up_near_a_tie_fails(dtype, delta, real_model, monkeypatch):
    verifier = runner_up_within(delta)
    r = run_and_check(dtype, real_model, verifier, monkeypatch)
    assert verifier.fired > 0  # the bug happened
    assert r["exit"] == 1 and how_it_failed(r), (r["lo"], r["checks"])
    print(dtype, delta, how_it_failed(r))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_verifier_one_rank_off_fails_under_the_measured_band(dtype, real_model, monkeypatch):
    one_rank_off.fired = 0
    r = run_and_check(dtype, real_model, one_rank_off, monkeypatch)
    assert one_rank_off.fired > 0
    assert r["lo"]["tokens_outside_band"] > 0 and r["exit"] == 1, r["lo"]


# -- run-level rules, no model -------------------------------------------------------------------------

def _summary(**lo) -> dict:
    base = {"questions": 6, "checked": 6, "exact": 6, "numeric_ties": 0, "mismatches": 0, "lossy_differences": 0,
            "tokens_checked": 600, "tokens_equal": 600, "tokens_numeric": 0, "tokens_outside_band": 0}
    return {"lossless": dict(base, **lo), "lossless_method": True}


CFG = {"lossless": {"check": True, "fail_on_mismatch": True, "max_numeric_share": 0.05}}


def test_too_many_numeric_tokens_fail_the_run(capsys):
    assert main_exit_code(_summary(tokens_numeric=12, tokens_equal=588), CFG) == 0  # 2%: honest half precision
    assert main_exit_code(_summary(tokens_numeric=31, tokens_equal=569), CFG) == 1  # 5.2%
    assert "more than lossless.max_numeric_share=0.05" in capsys.readouterr().err
    # a handful of flips in a short run is noise, not a share
    assert main_exit_code(_summary(tokens_checked=40, tokens_numeric=4, tokens_equal=36), CFG) == 0
    assert main_exit_code(_summary(tokens_numeric=31), {"lossless": dict(CFG["lossless"], max_numeric_share=None)}) == 0


def test_fewer_questions_checked_than_asked_fail_the_run(capsys):
    s = _summary(checked=5, exact=5)
    assert lossless.verdict_line(s["lossless"]).startswith("5/6 valid, 5 exact vs AR, 0 numeric, 5/6 checked")
    assert main_exit_code(s, CFG) == 1
    assert "only 5 of 6 questions checked" in capsys.readouterr().err
    assert main_exit_code(s, {"lossless": dict(CFG["lossless"], check=False)}) == 0  # nothing was promised
    assert lossless.verdict_line(_summary(checked=0, exact=0, tokens_checked=0)["lossless"]) == "unchecked (0/6 checked)"
    checks = [{"status": "exact"}] * 5
    assert lossless.tally(checks, 6)["questions"] == 6 and "questions" not in lossless.tally(checks)


def test_a_missing_turn_is_a_mismatch_not_exact():
    one = {"turns": [{"prompt_ids": [1], "token_ids": [2, 3]}]}
    two = {"turns": one["turns"] * 2}
    v = lossless.compare_question(None, two, one, "float32")
    assert v["status"] == "mismatch" and v["reason"] == "turns_differ" and (v["ar_turns"], v["method_turns"]) == (2, 1)
    assert lossless.compare_question(None, one, one, "float32")["status"] == "exact"


# -- run integrity: identity and order -------------------------------------------------------------------

def test_the_identity_names_code_questions_check_and_threads(tmp_path):
    import json

    from specbench.run import plan as runner
    from tests.test_config import cfg, plan_of

    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question_id": 1, "category": "qa", "turns": ["Hi?"]}\n')
    c = plan_of(cfg("task=spec_bench", f"task.path={questions}"))
    ident = runner.identity(c)
    assert len(ident["code_version"]) == 12 and ident["threads"] == torch.get_num_threads()
    assert ident["lossless_check"] is True and len(ident["task_sha256"]) == 64
    assert runner.identity(plan_of(cfg()))["task_sha256"] is None  # a built-in task
    questions.write_text('{"question_id": 1, "category": "qa", "turns": ["Hello?"]}\n')
    assert runner.identity(c)["task_sha256"] != ident["task_sha256"]  # same path, other questions
    # an identity committed before these keys: a resume refuses it, a reader of finished answers accepts
    old = {k: v for k, v in ident.items() if k not in runner.NEWER_IDENTITY_KEYS}
    (tmp_path / "run_config.json").write_text(json.dumps({"identity": old}))
    with pytest.raises(runner.SettingsError, match="code_version"):
        runner.check_identity(tmp_path, ident)
    runner.check_identity(tmp_path, ident, missing_ok=True)
    with pytest.raises(runner.SettingsError, match="dtype"):  # a key that differs still refuses
        runner.check_identity(tmp_path, dict(ident, dtype="float16"), missing_ok=True)


def test_ar_and_the_method_alternate_who_goes_first(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from specbench.inputs.tasks import load_task
    from specbench.run import baselines, question_loop
    from tests.test_config import plan_of

    order = []

    def answer(session, drafter, q):
        order.append((q.question_id, drafter))
        return {"question_id": q.question_id, "subtask": q.subtask, "category": q.category,
                "turns": [{"token_ids": [1], "new_tokens": 1, "wall_time": 1.0, "prefill_time": 0.1,
                           "accept_lengths": [1]}]}

    monkeypatch.setattr(question_loop, "timed_answer", answer)
    questions = load_task({"name": "mini", "kind": "mini", "limit": 4})
    plan = plan_of({"method": {"name": "tr"}, "progress": False, "lossless": {"check": False}})
    session = SimpleNamespace(plan=plan, cfg=plan.settings, questions=questions, folder=tmp_path)
    done: dict = {}
    question_loop.answer_questions(session, baselines.Interleaved(tmp_path / "baseline_answers.jsonl"), "tr", "ar",
                                   done)
    firsts = [order[2 * i][1] for i in range(len(questions))]
    assert firsts == ["ar", "tr", "ar", "tr"][:len(questions)]
    assert [done[q.question_id]["first"] for q in questions] == ["ar", "method", "ar", "method"][:len(questions)]


def test_the_referee_accepts_a_three_way_tie_and_refuses_a_wide_third():
    """The referee's rule: the method's token may be any token within the band of the row's top (a
    three-way near-tie in bfloat16 lets another forward's rounding pick the third), as long as float32
    cannot tell it from AR's token either; the run-dtype rank does not matter, the margins do."""
    band = 0.5
    scores = torch.tensor([10.0, 9.9, 9.8, 7.0])  # bfloat16 on a plain forward: 0 > 1 > 2 within 0.2
    exact = torch.tensor([10.05, 9.96, 9.97, 7.1])  # float32: the three agree to 0.1
    third = lossless.judge_divergence(scores, exact, ar_token=0, method_token=2, band=band)
    assert third["status"] == "numeric_tie" and third["method_token_rank"] == 2, third
    # the same third token, but float32 separates it from AR's by more than the band: a bug
    far = lossless.judge_divergence(scores, torch.tensor([10.0, 9.9, 9.2, 7.0]), 0, 2, band)
    assert far["status"] == "mismatch" and far["method_token_near_top"], far
    # a token far below the top in the run's dtype is a bug whatever float32 says
    low = lossless.judge_divergence(scores, torch.tensor([10.0, 9.9, 9.8, 9.9]), 0, 3, band)
    assert low["status"] == "mismatch" and not low["method_token_near_top"], low
    # the runner-up inside the band still passes, as before
    assert lossless.judge_divergence(scores, exact, 0, 1, band)["status"] == "numeric_tie"

"""The whole-output lossless check (specbench/run/lossless.py): its rounding band, its per-token
verdicts, every method on the real model in bfloat16 and float16, and a broken verifier caught in
every dtype."""

from __future__ import annotations

import pytest
import torch

from specbench.run import lossless
from specbench.run.lossless import classify_tokens
from specbench.run.rounding_band import rounding_band, ulp
from specbench.decoding.engine import Engine
from specbench.decoding.verify import accepted_path
from specbench.speculation.cost import CostCurve
from specbench.inputs.models import eos_token_ids, load_model, named_model_config
from specbench.registry import available_methods, build_drafter

HALF = ("bfloat16", "float16")


def test_the_band_follows_the_dtype_and_the_logits_size():
    assert ulp(40.0, "bfloat16") == 0.25 and ulp(40.0, "float16") == 2 ** -5 and ulp(40.0, "float32") == 2 ** -18
    assert ulp(10.0, "bfloat16") == ulp(40.0, "bfloat16") / 4  # the spacing grows with the magnitude
    assert rounding_band(40.0, "bfloat16") == 16 * 0.25
    assert rounding_band(40.0, "bfloat16", temperature=0.5) == 2 * 16 * 0.25  # on logits / T
    # float32: at least as tight as the fixed tolerance it replaces (1e-3) for logits up to 64
    assert all(rounding_band(m, "float32") < 1e-3 for m in (1.0, 20.0, 63.9))


def test_each_token_is_the_choice_within_the_band_or_outside():
    scores = torch.tensor([[5.0, 1.0, 0.0], [2.0, 1.9, 0.0], [3.0, 0.0, 2.0], [1.0, float("-inf"), 0.0]])
    tokens = torch.tensor([0, 1, 2, 1])
    c = classify_tokens(scores, tokens, torch.full((4,), 0.25))
    assert (c["tokens_checked"], c["tokens_equal"], c["tokens_numeric"], c["tokens_outside_band"]) == (4, 1, 1, 2)
    assert c["first_outside"] == {"index": 2, "token": 2, "margin": 1.0, "band": 0.25}


_MODELS: dict = {}


def model_in(dtype: str, real_model):
    """(model, eos) of the embedded model in `dtype`: the session's float32 one, or a copy loaded in half
    precision once per module (the session's model is never converted in place)."""
    if dtype == "float32":
        return real_model[0], real_model[2]
    if dtype not in _MODELS:
        model, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), getattr(torch, dtype))
        _MODELS[dtype] = (model, eos_token_ids(model, tok))
    return _MODELS[dtype]


def _record(prompt, out) -> dict:
    return {"turns": [{"prompt_ids": list(prompt), "token_ids": list(out)}]}


PROMPT = [{"role": "user", "content": "List three primary colours, one per line."}]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("method", available_methods())
def test_every_method_passes_the_whole_output_check_in_half_precision(method, dtype, real_model):
    """A short generation of every registered method in bfloat16 and float16 (a multi-row forward in
    half precision is slow on a CPU): every emitted token is the target's choice or within the band; a
    divergence from AR is judged by the float32 referee."""
    from specbench.inputs.chat import prompt_ids

    model, eos = model_in(dtype, real_model)
    prompt = prompt_ids(real_model[1], PROMPT)
    engine = Engine(model, eos)
    # a fixed, GPU-like cost curve: profiling one here would cost more than the test
    curve = CostCurve(widths=[1, 128], times=[0.02, 0.025])
    out = engine.generate(prompt, build_drafter(method, vocab_size=model.get_output_embeddings().weight.shape[0],
                                                model=model, model_name="smollm2-135m", dtype_name=dtype,
                                                hardware_curve=curve), 8).tokens
    c = lossless.check_tokens(model, _record(prompt, out), dtype)
    assert c["tokens_checked"] == len(out) and c["tokens_outside_band"] == 0, c
    ar = engine.generate(prompt, build_drafter("ar"), 8).tokens
    verdict = lossless.compare_question(model, _record(prompt, ar), _record(prompt, out), dtype)
    assert verdict["status"] in ("exact", "numeric_tie"), verdict


_VERIFY = Engine._verify


def _one_rank_off(self, logits, draft, draft_ids, cache_len, select, drafter):
    """A broken verifier: a draft token is accepted when it is its parent's *second* choice."""
    if draft is None:
        return _VERIFY(self, logits, draft, draft_ids, cache_len, select, drafter)
    size = draft.tree.size
    second = logits[:size].topk(2, dim=-1).indices[:, 1]
    path = accepted_path(self.tree_tensors(draft.tree), draft.tokens.to(logits.device), second)
    accepted = [a for a in path.tolist()[1:] if a]
    last = accepted[-1] if accepted else 0
    _one_rank_off.accepted += len(accepted)
    return accepted, [int(draft.tokens[a - 1]) for a in accepted] + [int(logits[last].argmax())], path


@pytest.mark.parametrize("dtype", ["float32", *HALF])
def test_a_verifier_one_rank_off_is_caught_in_every_dtype(dtype, real_model, monkeypatch):
    model, eos = model_in(dtype, real_model)
    from specbench.inputs.chat import prompt_ids

    prompt = prompt_ids(real_model[1], PROMPT)
    # a small template with second-rank children (half-precision tree forwards are slow on a CPU)
    tr = build_drafter("tr", vocab_size=model.get_output_embeddings().weight.shape[0], tree=[[4], [2, 2, 1, 1]])
    Engine(model, eos).generate(prompt, tr, 20)  # a correct pass first: TR's matrix holds the model's top-k
    _one_rank_off.accepted = 0
    monkeypatch.setattr(Engine, "_verify", _one_rank_off)
    out = Engine(model, eos).generate(prompt, tr, 20).tokens
    assert _one_rank_off.accepted > 0  # the bug happened
    c = lossless.check_tokens(model, _record(prompt, out), dtype)
    assert c["tokens_outside_band"] > 0, c


def test_the_verdict_line_counts_valid_exact_and_numeric_questions():
    checks = [{"status": "exact", "tokens": {"tokens_checked": 10, "tokens_outside_band": 0}}] * 7 + \
             [{"status": "numeric_tie", "tokens": {"tokens_checked": 10, "tokens_outside_band": 0}}] * 5
    assert lossless.verdict_line(lossless.tally(checks)) == \
        "12/12 valid, 7 exact vs AR, 5 numeric; 120 tokens checked, 0 outside the band"
    checks[0] = {"status": "exact", "tokens": {"tokens_checked": 10, "tokens_outside_band": 2}}
    checks[1] = {"status": "mismatch", "tokens": {"tokens_checked": 10, "tokens_outside_band": 0}}
    assert lossless.verdict_line(lossless.tally(checks)).startswith("10/12 valid, 6 exact vs AR, 5 numeric, 1 BUG(S)")

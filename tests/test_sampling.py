"""Lossless sampling: position-keyed Gumbel noise, filters equal to transformers', exact equality
of every method with AR's sampled output, and the output distribution of plain sampling."""

import math

import pytest
import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from methods.ar import Autoregressive
from methods.tr import TokenRecycling
from specbench.engine import Engine
from specbench.sampling import PositionSampler, filter_logits, position_uniforms


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (0.9, 0, 0.8), (1.3, 10, 0.5)])
def test_filters_equal_transformers_processors(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 3
    ours = filter_logits(logits, temperature, top_k, top_p)
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    torch.testing.assert_close(ours[~torch.isinf(ours)], ref[~torch.isinf(ref)])


def test_noise_is_a_function_of_key_and_position():
    pos = torch.tensor([5, 6, 7])
    a = position_uniforms(123, pos, 1000)
    assert torch.equal(a, position_uniforms(123, pos, 1000))
    assert torch.equal(a[1], position_uniforms(123, torch.tensor([6]), 1000)[0])  # no dependence on the batch
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a, position_uniforms(124, pos, 1000))
    u = position_uniforms(7, torch.arange(200), 1000).flatten()
    assert 0 < u.min() and u.max() < 1
    # uniformity: Kolmogorov-Smirnov on 200k draws, false-alarm rate 1e-4
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-4


@pytest.fixture(scope="module")
def small_vocab_model():
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=6, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharpen the random model a little so the distribution is not flat
        model.lm_head.weight.mul_(4)
    return model


def test_tr_equals_ar_when_sampling(small_vocab_model):
    engine = Engine(small_vocab_model, eos_token_ids=[])
    prompt = [1, 2, 3, 4, 5]
    for temperature in (0.7, 1.0):
        tr = TokenRecycling(vocab_size=6, k=4, tree=[[3], [2, 1, 1], [1, 1, 0, 0]])
        for qid in range(4):
            s = PositionSampler(temperature, seed=11)
            s.bind(qid, 0)
            ar = engine.generate(prompt, Autoregressive(), 30, s)
            out = engine.generate(prompt, tr, 30, s)
            assert out.tokens == ar.tokens
        assert max(out.accept_lengths) > 1  # drafts did get accepted


def exact_first_three(model, prompt, temperature, top_k):
    with torch.no_grad():
        dist = {}
        for t1 in range(6):
            for t2 in range(6):
                ids = torch.tensor([prompt + [t1, t2]])
                logits = model(input_ids=ids).logits[0, -3:]
                lp = filter_logits(logits, temperature, top_k).log_softmax(-1)
                for t3 in range(6):
                    dist[(t1, t2, t3)] = math.exp(lp[0, t1] + lp[1, t2] + lp[2, t3])
    return dist


def test_real_model_tr_equals_ar_when_sampling(real_model, spec_bench_path):
    from specbench.chat import prompt_ids
    from specbench.tasks import load_jsonl_questions, select_per_subtask

    model, tok, eos = real_model
    engine = Engine(model, eos)
    qs = [q for q in select_per_subtask(load_jsonl_questions(spec_bench_path), 1)
          if q.subtask in ("math_reasoning", "summarization")]
    tr = TokenRecycling(vocab_size=model.config.vocab_size)
    accepted = []
    for temperature in (0.7, 1.0):
        for q in qs:
            ids = prompt_ids(tok, [{"role": "user", "content": q.turns[0]}])
            s = PositionSampler(temperature, seed=0)
            s.bind(q.question_id, 0)
            ar = engine.generate(ids, Autoregressive(), 40, s)
            out = engine.generate(ids, tr, 40, s)
            assert out.tokens == ar.tokens, (temperature, q.question_id)
            accepted += out.accept_lengths
    assert max(accepted) > 1


@pytest.mark.parametrize("method", ["ar", "tr"])
def test_first_three_tokens_follow_the_target_distribution(small_vocab_model, method):
    """Chi-square goodness of fit against the exact distribution; deterministic seeds, false-alarm
    rate 1e-3 per test."""
    prompt = [1, 2, 3, 4]
    temperature, top_k = 0.9, 4
    exact = exact_first_three(small_vocab_model, prompt, temperature, top_k)
    engine = Engine(small_vocab_model, eos_token_ids=[])
    drafter = Autoregressive() if method == "ar" else TokenRecycling(vocab_size=6, k=4, tree=[[2], [1, 1]])
    n = 1500
    counts: dict = {}
    for seed in range(n):
        s = PositionSampler(temperature, top_k=top_k, seed=seed)
        s.bind("q", 0)
        toks = tuple(engine.generate(prompt, drafter, 3, s).tokens)
        counts[toks] = counts.get(toks, 0) + 1
    assert all(exact[c] > 0 for c in counts)  # nothing outside the top-k support
    cells = sorted(exact, key=exact.get, reverse=True)
    big = [c for c in cells if exact[c] * n >= 5]
    rest = [c for c in cells if exact[c] * n < 5]
    observed = [counts.get(c, 0) for c in big] + [sum(counts.get(c, 0) for c in rest)]
    expected = [exact[c] * n for c in big] + [sum(exact[c] for c in rest) * n]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    dof = sum(e > 0 for e in expected) - 1
    assert stats.chi2.sf(chi2, dof) > 1e-3, (chi2, dof)

"""Lossless sampling: position-keyed Gumbel noise, filters equal to transformers', exact equality
of every method with AR's sampled output, and the output distribution of plain sampling."""

import math

import pytest
import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from specbench.methods.ar import Autoregressive
from specbench.methods.tr.base import TokenRecycling
from specbench.decoding.engine import Engine
from specbench.registry import available_methods
from specbench.decoding.sampling import PositionSampler, filter_logits, position_uniforms


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


def test_a_position_drawn_once_gives_the_same_tokens_as_drawn_afresh():
    """The sampler reuses a position's noise across steps (a tree re-verifies the positions past its
    accepted path): every call equals one on a fresh sampler, and only a bounded window is kept."""
    from specbench.decoding import sampling

    g = torch.Generator().manual_seed(1)
    reused = PositionSampler(0.8, seed=3)
    steps = [[10, 11, 11, 12], [11, 12, 13, 13, 14], [12], [12, 13, 14, 15, 16, 17]] + [[p] for p in range(18, 120)]
    for positions in steps:
        logits = torch.randn(len(positions), 300, generator=g)
        pos = torch.tensor(positions)
        assert torch.equal(reused(logits, pos), PositionSampler(0.8, seed=3)(logits, pos))
        assert len(reused._rows) <= sampling.KEPT_NOISE_ROWS
    rows = reused.noise_rows([118, 119], 300, "cpu")
    assert torch.equal(rows, sampling.gumbel_noise(reused.key, torch.tensor([118, 119]), 300))
    reused.bind("q1", 0)  # another stream: nothing of the last one is reused
    assert torch.equal(reused.noise_rows([119], 300, "cpu"), sampling.gumbel_noise(reused.key, torch.tensor([119]), 300))
    assert list(reused._rows) == [119]


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (7, 0.9)])
def test_the_sampler_is_the_argmax_of_tempered_logits_plus_the_positions_noise(top_k, top_p):
    """The CPU path adds each position's row in place, run by run of equal positions, and takes numpy's
    argmax: the same tokens as the formula in one piece, positions in any order."""
    from specbench.decoding import sampling

    g = torch.Generator().manual_seed(2)
    sampler = PositionSampler(0.7, top_k, top_p, seed=5)
    sampler.bind("q", 1)
    for positions in ([40], [41, 42, 42, 43, 43, 43], [44, 43, 44, 45, 43, 45]):
        logits = torch.randn(len(positions), 500, generator=g) * 4
        pos = torch.tensor(positions)
        want = (filter_logits(logits, 0.7, top_k, top_p) + sampling.gumbel_noise(sampler.key, pos, 500)).argmax(dim=-1)
        assert torch.equal(sampler(logits, pos), want)


def test_the_host_noise_equals_the_torch_noise_bit_for_bit():
    """The CPU path hashes in uint32 (numpy wraps its products); the torch path in int64 with masks:
    the same noise at positions and keys where 32-bit products and 2 * position + 1 wrap."""
    from specbench.decoding.sampling import HostNoise, gumbel_noise

    host = HostNoise()
    for vocab in (7, 1000, 49152):
        for key in (0, 5, 2**31 + 11, 2**32 - 1):
            for position in (0, 1, 77, 2**31 - 1, 2**31, 2**32 + 3):
                assert torch.equal(host(key, position, vocab), gumbel_noise(key, torch.tensor([position]), vocab)[0])


def test_the_noise_table_holds_each_uniforms_noise():
    """`gumbel_table()[0][k]` is the noise of uniform index k (the hash's top 24 bits), bit for bit as a
    drawn row has it; low and high bound each run of indices."""
    from specbench.decoding import sampling

    table, low, high = sampling.gumbel_table()
    for key, position in ((0, 0), (2**32 - 1, 17), (99, 2**31 + 5)):
        u = sampling.position_uniforms(key, torch.tensor([position]), 49152)[0]
        index = (u * (1 << 24) - 0.5).round().long()  # u = (index + 0.5) / 2**24, exactly
        assert torch.equal(table[index], sampling.gumbel_noise(key, torch.tensor([position]), 49152)[0])
    runs = table.view(len(low), -1)
    assert torch.equal(low, runs.amin(1)) and torch.equal(high, runs.amax(1))


def keyed_cases():
    """Rows as the verifier meets them, with the edges argmax has to agree on."""
    g = torch.Generator().manual_seed(7)
    for vocab in (7, 13, 1000, 49152):  # tails past the kernel's blocks of 8
        for scale in (0.5, 3.0, 12.0, 40.0):  # flat rows (many entries in reach) to peaked ones
            yield torch.randn(5, vocab, generator=g) * scale
    x = (torch.randn(6, 2000, generator=g) * 2).round()  # ties in the score
    x[:, 1000:] = x[:, :1000]
    yield x
    x = torch.randn(4, 3000, generator=g) * 5
    x[0, torch.randperm(3000, generator=g)[:2900]] = float("-inf")  # top-k / top-p filtered
    x[1] = float("-inf")  # nothing left: argmax says index 0
    x[2, [5, 900]] = float("nan")  # the first NaN
    x[3, [40, 41]] = float("inf")  # the first infinite score
    yield x


def test_the_keyed_kernel_samples_what_the_drawn_rows_do(packed_kernel):
    """`sample_keyed` gives argmax(scores + gumbel_noise) row by row without drawing the rows: the same
    index on flat and peaked rows, ties, filtered, NaN and infinite scores, repeated positions and keys
    where the hash wraps."""
    from specbench.decoding import sampling

    table = sampling.gumbel_table()
    for i, scores in enumerate(keyed_cases()):
        for key in (0, 2**32 - 1, 12345 + i):
            positions = [3, 3, 4] + list(range(2**31 - 1, 2**31 - 1 + scores.shape[0] - 3))
            want = (scores + sampling.gumbel_noise(key, torch.tensor(positions), scores.shape[1])).argmax(dim=-1)
            got = torch.ops.specbench.sample_keyed(scores.contiguous(), key, positions, *table)
            assert torch.equal(got, want), (i, key)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (7, 0.9)])
def test_the_sampler_samples_the_same_with_its_kernel_and_with_whole_rows(packed_kernel, monkeypatch, top_k, top_p):
    from specbench.decoding import sampling

    g = torch.Generator().manual_seed(9)
    keyed = PositionSampler(0.7, top_k, top_p, seed=1)
    monkeypatch.setenv(sampling.KERNEL_ENV, "off")
    whole = PositionSampler(0.7, top_k, top_p, seed=1)
    assert not whole.keyed()
    monkeypatch.delenv(sampling.KERNEL_ENV)
    assert keyed.keyed()
    for positions in ([40], [41, 42, 42, 43, 43, 43], [44, 43, 44, 45, 43, 45]):
        logits, pos = torch.randn(len(positions), 49152, generator=g) * 4, torch.tensor(positions)
        assert torch.equal(keyed(logits, pos), whole(logits, pos))


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


def small_vocab_drafter(method: str, model, tmp_path):
    """Every registered method, sized for the 6-token model (whatever it needs built in tmp_path)."""
    from specbench.speculation.cost import CostCurve
    from specbench.methods.medusa.heads import MedusaHeads, save_heads
    from specbench.registry import build_drafter
    from specbench.drafting.datastore import build_datastore

    tree = [[2], [1, 1]]
    kwargs = {
        "ar": {},
        "tr": {"k": 4, "tree": tree},
        # rows cost nothing, so the adaptive tree always drafts
        "tr_adaptive": {"k": 4, "tree": tree, "hardware_curve": CostCurve(widths=[1, 8], times=[1.0, 1.0])},
        "tr_fused": {"k": 4, "tree": tree, "max_ngram_size": 2, "num_pred_tokens": 3,
                     "hardware_curve": CostCurve(widths=[1, 8], times=[1.0, 1.0])},
        "pld": {"max_ngram_size": 2, "num_pred_tokens": 3},
        "lookahead": {"N": 3, "W": 2, "G": 2},
        "rest": {"num_draft": 4, "continuation_len": 3, "min_token_span": 1},
        "medusa": {"choices": [[0], [1], [0, 0]]},
        "samd": {"k": 4, "tree": tree, "max_draft": 3, "len_threshold": 1},
        "suffix": {"use_tree": True},
        "sps": {"draft": "self:layers=1", "gamma": 2},
        "eagle": {"total_tokens": 6, "depth": 2, "top_k": 2},
    }
    if method not in kwargs:
        raise AssertionError(f"method '{method}' is registered but this test does not know how to build it "
                             f"for a 6-token model: add it to small_vocab_drafter")
    if method == "rest":
        g = torch.Generator().manual_seed(4)
        docs = [torch.randint(0, 6, (40,), generator=g).tolist() for _ in range(20)]
        build_datastore(docs, tmp_path / "rest", vocab_size=6, tokenizer="small-vocab")
        kwargs["rest"]["datastore"] = str(tmp_path / "rest")
    if method == "medusa":
        torch.manual_seed(5)
        heads = MedusaHeads(2, model.config.hidden_size, 6, shared_projection=True)
        with torch.no_grad():
            for p in heads.parameters():
                p.normal_(0, 0.5)  # not the zero-init identity: the heads should guess differently
        save_heads(heads, tmp_path / "medusa", dtype=torch.float32)
        kwargs["medusa"]["heads"] = str(tmp_path / "medusa")
    if method == "eagle":
        from specbench.methods.eagle.head import EagleHead, HeadConfig, save_head

        torch.manual_seed(6)
        head = EagleHead(HeadConfig.for_target(model.config))
        save_head(head, tmp_path / "eagle", dtype=torch.float32)
        kwargs["eagle"]["head"] = str(tmp_path / "eagle")
    return build_drafter(method, vocab_size=6, device="cpu", model=model, model_name="small-vocab",
                         dtype_name="float32", **kwargs[method])


@pytest.mark.parametrize("method", available_methods())
def test_first_three_tokens_follow_the_target_distribution(small_vocab_model, method, tmp_path):
    """Chi-square goodness of fit against the exact distribution; deterministic seeds, false-alarm
    rate 1e-3 per test."""
    prompt = [1, 2, 3, 4]
    temperature, top_k = 0.9, 4
    exact = exact_first_three(small_vocab_model, prompt, temperature, top_k)
    engine = Engine(small_vocab_model, eos_token_ids=[])
    drafter = small_vocab_drafter(method, small_vocab_model, tmp_path)
    n = 1500
    counts: dict = {}
    drafted = 0
    for seed in range(n):
        s = PositionSampler(temperature, top_k=top_k, seed=seed)
        s.bind("q", 0)
        r = engine.generate(prompt, drafter, 3, s)
        drafted += sum(r.accept_lengths) - len(r.accept_lengths)
        counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
    assert method == "ar" or drafted > 0, "no draft token was ever accepted: the test would not test the verifier"
    assert all(exact[c] > 0 for c in counts)  # nothing outside the top-k support
    cells = sorted(exact, key=exact.get, reverse=True)
    big = [c for c in cells if exact[c] * n >= 5]
    rest = [c for c in cells if exact[c] * n < 5]
    observed = [counts.get(c, 0) for c in big] + [sum(counts.get(c, 0) for c in rest)]
    expected = [exact[c] * n for c in big] + [sum(exact[c] for c in rest) * n]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    dof = sum(e > 0 for e in expected) - 1
    assert stats.chi2.sf(chi2, dof) > 1e-3, (chi2, dof)

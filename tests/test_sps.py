"""Speculative sampling (specbench/methods/sps.py): settings refused before anything loads, the
self-speculative draft as the target cut short (weights shared), the draft's KV cache in step with the
decided sequence, a separate draft model from a directory, and the Gumbel-max coupling at T > 0.
Equality with AR on the real model, greedy and sampled, is tests/test_lossless_methods.py's."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForCausalLM, LlamaForCausalLM

from specbench.decoding.engine import Engine
from specbench.errors import SettingsError
from specbench.methods.sps import SpeculativeSampling, self_draft
from specbench.registry import build_drafter
from tests.conftest import position_sampler

TARGET = {"model_name": "smollm2-135m", "device": "cpu", "dtype_name": "float32"}


def sps(model, **settings):
    return build_drafter("sps", vocab_size=model.get_output_embeddings().weight.shape[0], model=model, **settings)


@pytest.mark.parametrize("params,message", [
    ({"gamma": 0}, "method.gamma must be at least 1"),
    ({"draft": "self:layers=0"}, "not a self-speculative draft; write self:layers=N"),
    ({"draft": "self:layer=4"}, "not a self-speculative draft"),
    ({"draft": "self"}, "not a self-speculative draft"),
    ({"draft": 4}, "method.draft must be self:layers=N or a draft model"),
    ({"draft": "vicuna-86m"}, "neither self:layers=N, a model config .*vicuna-7b"),
    ({"draft": "/no/such/draft"}, "model.path '/no/such/draft' not found"),
])
def test_bad_settings_are_refused_before_any_model_loads(params, message):
    with pytest.raises(SettingsError, match=message):
        SpeculativeSampling.check_settings(params, TARGET)


def test_good_settings_pass_and_name_the_draft():
    for draft in ("self:layers=4", "vicuna-68m", "double7/vicuna-68m"):
        assert SpeculativeSampling.check_settings({"draft": draft}, TARGET)["draft"] == draft
    from specbench.inputs.models import named_model_config

    assert named_model_config("vicuna-68m")["path"] == "double7/vicuna-68m"  # Spec-Bench's draft for vicuna-7b


def test_a_draft_deeper_than_the_target_is_refused_when_built(tiny_llama):
    with pytest.raises(SettingsError, match="self:layers=3, but the target has 2 decoder layers; use 1 to 2"):
        sps(tiny_llama, draft="self:layers=3")


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_the_self_draft_is_the_target_cut_short_with_its_weights_shared(family, tiny_llama, tiny_gemma):
    target = tiny_llama if family == "llama" else tiny_gemma
    draft = self_draft(target, 1)
    owned = {p.data_ptr() for p in target.parameters()}
    assert {p.data_ptr() for p in draft.parameters()} <= owned  # shared, not copied
    assert len(draft.get_decoder().layers) == 1 and draft.lm_head.weight is target.lm_head.weight
    assert len(target.get_decoder().layers) == 2 and target.config.num_hidden_layers == 2  # untouched
    # the same logits as a one-layer model of the class loaded with the target's first layer
    config = type(target.config).from_dict(target.config.to_dict())
    config.num_hidden_layers = 1
    if family == "gemma":
        config.layer_types = config.layer_types[:1]
    reference = (LlamaForCausalLM if family == "llama" else Gemma3ForCausalLM)(config).eval()
    reference.load_state_dict({k: v for k, v in target.state_dict().items() if ".layers.1." not in k})
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(draft(input_ids=ids).logits, reference(input_ids=ids).logits)
        assert not torch.allclose(draft(input_ids=ids).logits, target(input_ids=ids).logits)


def from_scratch(model, tokens: torch.Tensor, gamma: int, sampler=None) -> list[int]:
    """The draft chain a cache-free draft would propose after `tokens`: each token from a forward over
    the whole sequence, chosen at its parent's absolute position."""
    seq = tokens.tolist()
    with torch.no_grad():
        for _ in range(gamma):
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1:]
            pos = torch.tensor([len(seq) - 1])
            seq.append(int((logits.argmax(-1) if sampler is None else sampler(logits, pos))[0]))
    return seq[tokens.numel():]


@pytest.mark.parametrize("family,temperature", [("llama", 0.0), ("llama", 0.8), ("gemma", 0.0)])
def test_the_draft_cache_follows_the_decided_sequence(family, temperature, tiny_llama, tiny_gemma):
    """Every chain equals the one a draft without a cache proposes on the decided sequence: after full
    acceptance, partial acceptance, a new question and a new turn (Gemma: past its sliding window of 4)."""
    target = tiny_llama if family == "llama" else tiny_gemma
    engine = Engine(target, eos_token_ids=[])
    drafter = sps(target, draft="self:layers=1", gamma=3)
    propose, checked = drafter.propose, []

    def checked_propose(state):
        draft = propose(state)
        expected = from_scratch(drafter.draft_model, state.tokens, 3, drafter.sampler)
        checked.append(draft.tokens.tolist() == expected)
        return draft

    drafter.propose = checked_propose
    lengths = []
    for question, prompt in enumerate(([3, 14, 15, 92, 65], [2, 71, 82, 81, 82, 84, 59, 4, 5])):
        drafter.start_question()
        for turn in range(2):
            sampler = drafter.sampler = position_sampler(temperature, question, turn)
            ar = engine.generate(prompt, build_drafter("ar"), 30, sampler).tokens
            out = engine.generate(prompt, drafter, 30, sampler)
            assert out.tokens == ar
            lengths += out.accept_lengths
            prompt = prompt + out.tokens[:7]  # the next turn's prompt shares its start with this turn
    assert checked and all(checked), f"{checked.count(False)} of {len(checked)} chains differ from a cache-free draft"
    assert max(lengths) == 4 and min(lengths) == 1  # whole chains accepted, and none


def save_model_dir(model, path):
    """`model` as a model directory the loader reads: weights, config and a (one-word) tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(path)
    words = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>").save_pretrained(path)
    return str(path)


def test_a_separate_draft_model_from_a_directory(tiny_llama, tmp_path):
    """A draft loaded from its own directory (here the target's twin, so every chain is accepted whole);
    one with another vocabulary is refused."""
    draft = save_model_dir(tiny_llama, tmp_path / "twin")
    assert SpeculativeSampling.check_settings({"draft": draft}, TARGET)["draft"] == draft
    drafter = sps(tiny_llama, draft=draft, gamma=3)
    owned = {p.data_ptr() for p in tiny_llama.parameters()}
    assert not {p.data_ptr() for p in drafter.draft_model.parameters()} & owned  # its own weights
    engine = Engine(tiny_llama, eos_token_ids=[])
    out = engine.generate([5, 6, 7, 8], drafter, 25)
    assert out.tokens == engine.generate([5, 6, 7, 8], build_drafter("ar"), 25).tokens
    assert out.accept_lengths == [4] * 6
    from transformers import LlamaConfig

    config = LlamaConfig(**{**tiny_llama.config.to_dict(), "vocab_size": 98})
    other = save_model_dir(LlamaForCausalLM(config), tmp_path / "other")
    with pytest.raises(SettingsError, match="vocabulary of 98 tokens, the target 97: SpS needs a draft with"):
        sps(tiny_llama, draft=other)


def test_the_coupled_draft_proposes_the_target_s_own_samples(real_model, spec_bench_prompts, ar_tokens):
    """At T = 0.7 a draft as deep as the target and drawing the target's keyed noise at the same
    positions proposes exactly the target's samples: every chain is accepted whole. Its argmax is
    accepted far less often. Both emit AR's tokens."""
    model, _, eos = real_model
    qid, ids = spec_bench_prompts["qa"]
    engine = Engine(model, eos)
    lengths = {}
    for coupled in (True, False):
        drafter = sps(model, draft=f"self:layers={model.config.num_hidden_layers}", gamma=4, coupled=coupled)
        drafter.sampler = sampler = position_sampler(0.7, qid)
        out = engine.generate(ids, drafter, 16, sampler)
        assert out.tokens == ar_tokens(ids, 24, 0.7, qid)[:16]  # the lossless suite's reference, cached
        lengths[coupled] = out.accept_lengths
    assert lengths[True] == [5, 5, 5], lengths[True]  # 15 tokens after the prefill's first
    assert len(lengths[False]) > 4, lengths[False]

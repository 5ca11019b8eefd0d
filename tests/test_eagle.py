"""EAGLE: the head against transformers' own Llama layer, a checkpoint in the published layout, the
EAGLE-2 rerank, and losslessness on a tiny model with both trees (the real model's lossless tests at
three temperatures are test_lossless_methods.py's)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import LlamaConfig

from specbench.decoding.engine import Engine
from specbench.methods.eagle.drafter import Eagle
from specbench.methods.eagle.head import EagleHeadError, HeadConfig, load_head
from specbench.registry import build_drafter
from tests.conftest import position_sampler


def write_published_head(directory, target, seed: int = 0, scale: float = 0.3):
    """A random head written as EAGLE's authors publish theirs: a LlamaConfig with one layer and
    "bias", and pytorch_model.bin holding fc, layer 0 without its input norm, and a copy of the
    target's embedding. Built from transformers' own LlamaDecoderLayer, independently of ours."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    t = target.config
    cfg = LlamaConfig(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                      num_hidden_layers=1, num_attention_heads=t.num_attention_heads,
                      num_key_value_heads=t.num_key_value_heads, rope_theta=5e5)
    torch.manual_seed(seed)
    layer = LlamaDecoderLayer(cfg, 0)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, scale) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    fc = torch.nn.Linear(2 * t.hidden_size, t.hidden_size)
    state = {f"layers.0.{k}": v for k, v in layer.state_dict().items() if not k.startswith("input_layernorm")}
    state |= {"fc.weight": fc.weight.detach(), "fc.bias": fc.bias.detach(),
              "embed_tokens.weight": target.get_input_embeddings().weight.detach().clone()}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**cfg.to_dict(), "bias": True}))
    torch.save(state, directory / "pytorch_model.bin")
    return cfg, layer, fc


def test_a_published_checkpoint_loads_and_computes_as_a_llama_layer(tiny_llama, tmp_path):
    """The head = fc, then transformers' LlamaDecoderLayer without its input norm, causal, with RoPE."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg, layer, fc = write_published_head(tmp_path / "head", tiny_llama)
    head = load_head(tmp_path / "head", tiny_llama.get_input_embeddings().weight)
    n, hidden = 7, cfg.hidden_size
    torch.manual_seed(1)
    features, embeds = torch.randn(n, hidden), torch.randn(n, hidden)
    positions = torch.arange(3, 3 + n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    ours, _ = head(features, embeds, positions, causal)

    cfg._attn_implementation = "eager"
    layer.input_layernorm = torch.nn.Identity()
    x = fc(torch.cat([embeds, features], -1))[None]
    cos, sin = LlamaRotaryEmbedding(cfg)(x, positions[None])
    mask = torch.zeros(1, 1, n, n).masked_fill(~causal, float("-inf"))
    ref = layer(x, attention_mask=mask, position_ids=positions[None], position_embeddings=(cos, sin))
    ref = ref[0] if isinstance(ref, tuple) else ref
    torch.testing.assert_close(ours, ref[0], rtol=1e-4, atol=1e-4)


def test_a_head_for_another_model_is_refused(tiny_llama, tmp_path):
    write_published_head(tmp_path / "head", tiny_llama)
    with pytest.raises(EagleHeadError, match="embedding of shape"):
        load_head(tmp_path / "head", torch.zeros(50, tiny_llama.config.hidden_size))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"hidden_size": 32, "intermediate_size": 64,
                                                              "num_attention_heads": 4}))
    torch.save({"fc.weight": torch.zeros(32, 64)}, tmp_path / "bad" / "pytorch_model.bin")
    with pytest.raises(EagleHeadError, match="missing"):
        load_head(tmp_path / "bad")


@pytest.mark.parametrize("tree", ["dynamic", "static"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_eagle_with_a_published_checkpoint_emits_ar_tokens(tiny_llama, tmp_path, tree, temperature):
    write_published_head(tmp_path / "head", tiny_llama)
    engine = Engine(tiny_llama, eos_token_ids=[])
    prompt = [5, 9, 13, 17, 9, 13, 17, 21, 9, 13]
    drafter = build_drafter("eagle", vocab_size=97, model=tiny_llama, model_name="tiny",
                            head=str(tmp_path / "head"), tree=tree, total_tokens=12, depth=3, top_k=3,
                            choices=[[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    sampler = position_sampler(temperature, "q1")
    ar = engine.generate(prompt, build_drafter("ar"), 40, position_sampler(temperature, "q1"))
    out = engine.generate(prompt, drafter, 40, sampler)
    assert out.tokens == ar.tokens
    assert set(out.step_rows) == {12 if tree == "dynamic" else 6}  # a full draft every step


def test_the_rerank_keeps_the_most_confident_candidates_as_a_tree():
    drafter = Eagle.__new__(Eagle)
    drafter.settings = Eagle.Settings(total_tokens=4)
    # candidates 0, 1 under the root; 2, 3 under 0; 4 under 1. Scores are path log-probabilities, and
    # candidate 2 ties its parent exactly: the parent must come first.
    scores = torch.tensor([-0.5, -1.0, -0.5, -3.0, -1.2])
    parents = torch.tensor([-1, -1, 0, 0, 1])
    tokens = torch.tensor([10, 11, 12, 13, 14])
    draft = drafter._rerank(scores, tokens, parents)
    assert draft.tokens.tolist() == [10, 11, 12]
    assert list(draft.tree.parents) == [0, 0, 1]
    # the path probabilities travel with the draft, for a batch policy to rank its nodes by
    assert draft.node_probs == pytest.approx([math.exp(-0.5), math.exp(-1.0), math.exp(-0.5)])


def test_the_dynamic_tree_grows_from_the_most_confident_paths(tiny_llama, tmp_path):
    """EAGLE-2: with depth d and top_k k, the draft is at most d + 1 deep, and its nodes are the best
    total_tokens - 1 by path confidence among what was expanded."""
    write_published_head(tmp_path / "head", tiny_llama)
    drafter = build_drafter("eagle", vocab_size=97, model=tiny_llama, model_name="tiny",
                            head=str(tmp_path / "head"), total_tokens=20, depth=3, top_k=4)
    engine = Engine(tiny_llama, eos_token_ids=[])
    drafts = []
    propose = drafter.propose
    drafter.propose = lambda state: drafts.append(propose(state)) or drafts[-1]
    engine.generate([5, 9, 13, 17, 21], drafter, 12)
    for d in drafts:
        assert len(d.tree) == 19 and d.tree.max_depth <= 4
        assert max(len(c) for c in d.tree.children) <= 4  # top_k children at most under any node


def test_bad_eagle_settings_are_refused_before_loading(tmp_path):
    target = {"model_name": "smollm2-135m", "device": "cpu", "dtype_name": "float32"}
    from specbench.errors import SettingsError

    with pytest.raises(SettingsError, match="method.tree must be one of dynamic, static"):
        Eagle.check_settings({"tree": "beam"}, target)
    with pytest.raises(SettingsError, match="total_tokens must be at least 2"):
        Eagle.check_settings({"total_tokens": 1}, target)
    with pytest.raises(EagleHeadError, match="has no config.json"):
        (tmp_path / "empty").mkdir()
        Eagle.check_settings({"head": str(tmp_path / "empty")}, target)
    with pytest.raises(EagleHeadError, match="no default EAGLE head for model 'gpt2'"):
        Eagle.check_settings({}, {**target, "model_name": "gpt2"})


def test_a_head_config_follows_the_target():
    cfg = HeadConfig.for_target(LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                                            num_key_value_heads=2, vocab_size=50, rope_theta=5e5))
    assert (cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads, cfg.rope_theta) == (64, 16, 2, 5e5)

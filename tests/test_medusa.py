"""Medusa: heads (zero-init identity, published checkpoint layout), trees from choices lists,
drafting from the right hidden state, equality with AR on the embedded model with the embedded
heads, typical acceptance (lossy, flagged), and a training smoke run."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

from specbench.methods.ar import Autoregressive
from specbench.methods.medusa.drafter import Medusa
from specbench.draft import DecodeState, Draft, StepOutcome
from specbench.drafter import reads_hidden_states
from specbench.decoding.engine import Engine
from specbench.drafting.choices import ChoicesError, load_choices, tree_from_choices
from specbench.methods.medusa.heads import (DEFAULT_HEADS, MedusaHeads, MedusaHeadsError, ResBlock, load_heads, resolve_heads_dir, save_heads)
from specbench.registry import build_drafter
from specbench.draft import DraftTree
from specbench.decoding.verify import accept_path
from tests.conftest import ROOT


def test_fresh_head_is_identity_then_projection():
    torch.manual_seed(0)
    heads = MedusaHeads(num_heads=3, hidden_size=16, vocab_size=50, num_layers=2)
    x = torch.randn(7, 16)
    out = heads(x)
    assert out.shape == (3, 7, 50)
    for k in range(3):
        assert torch.equal(heads.blocks[k](x), x)  # zero-initialised W: SiLU(0) = 0
        torch.testing.assert_close(out[k], heads.projections[k](x))
    shared = MedusaHeads(num_heads=2, hidden_size=16, vocab_size=50, shared_projection=True)
    lm_head = torch.randn(50, 16)
    shared.set_shared_projection(lm_head)
    torch.testing.assert_close(shared(x), (x @ lm_head.T).expand(2, 7, 50))
    assert shared(x, num_heads=1).shape == (1, 7, 50)
    with pytest.raises(MedusaHeadsError, match="trained for another model"):
        shared.set_shared_projection(torch.randn(51, 16))


def _published_checkpoint(path, num_heads=5, hidden=16, vocab=40, layers=1):
    """A checkpoint as FasterDecoding's MedusaModel saves one: the state dict of a ModuleList of
    Sequential(ResBlock x layers, Linear(hidden, vocab, bias=False)), plus config.json."""
    torch.manual_seed(1)
    medusa_head = nn.ModuleList(
        nn.Sequential(*[ResBlock(hidden) for _ in range(layers)], nn.Linear(hidden, vocab, bias=False))
        for _ in range(num_heads))
    for p in medusa_head.parameters():
        nn.init.normal_(p, std=0.3)
    path.mkdir(parents=True, exist_ok=True)
    state = medusa_head.state_dict()
    assert "0.0.linear.weight" in state and f"0.{layers}.weight" in state  # the published key names
    torch.save(state, path / "medusa_lm_head.pt")
    (path / "config.json").write_text(json.dumps({
        "medusa_num_heads": num_heads, "medusa_num_layers": layers,
        "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    return medusa_head


def test_loads_published_layout(tmp_path):
    ref = _published_checkpoint(tmp_path / "heads", layers=2)
    x = torch.randn(3, 16)
    heads = load_heads(tmp_path / "heads")
    assert (heads.num_heads, heads.num_layers, heads.hidden_size, heads.vocab_size) == (5, 2, 16, 40)
    with torch.no_grad():
        expect = torch.stack([h(x) for h in ref])
        torch.testing.assert_close(heads(x), expect)
        torch.testing.assert_close(load_heads(tmp_path / "heads", num_heads=4)(x), expect[:4])
    with pytest.raises(MedusaHeadsError, match="holds 5 heads"):
        load_heads(tmp_path / "heads", num_heads=6)
    # A checkpoint whose keys are not the published ones is refused with the expected names.
    torch.save({"head0.weight": torch.zeros(16, 16)}, tmp_path / "heads" / "medusa_lm_head.pt")
    with pytest.raises(MedusaHeadsError, match="0.0.linear.weight"):
        load_heads(tmp_path / "heads")


def test_compact_shared_projection_round_trip(tmp_path):
    heads = MedusaHeads(4, 16, 40, shared_projection=True)
    for p in heads.parameters():
        nn.init.normal_(p, std=0.3)
    save_heads(heads, tmp_path / "compact", dtype=torch.float16)
    back = load_heads(tmp_path / "compact")
    assert back.shared_projection and back.vocab_size == 40
    for k, v in heads.published_state_dict().items():
        torch.testing.assert_close(back.published_state_dict()[k], v.half().float())
    assert not any(k.endswith(f".{heads.num_layers}.weight") for k in back.published_state_dict())


def test_heads_sources(tmp_path, monkeypatch):
    assert resolve_heads_dir("default", "smollm2-135m") == ROOT / "data/medusa/smollm2-135m"
    assert (ROOT / "data/medusa/smollm2-135m/medusa_lm_head.safetensors").is_file()
    with pytest.raises(MedusaHeadsError, match="no default Medusa heads for model 'gemma3-270m'"):
        resolve_heads_dir("default", "gemma3-270m")
    with pytest.raises(MedusaHeadsError, match="method.heads=<dir>"):
        resolve_heads_dir(str(tmp_path / "missing"), "vicuna-7b")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail fast, no retries
    with pytest.raises(MedusaHeadsError, match="method.heads=DIR") as err:
        resolve_heads_dir("default", "vicuna-7b")
    assert DEFAULT_HEADS["vicuna-7b"] in str(err.value) and "medusa_lm_head.pt" in str(err.value)


def test_tree_from_choices_by_hand():
    # Given out of order on purpose: Medusa sorts by depth, then by path.
    t = tree_from_choices([[0, 0, 0], [1], [0, 1], [0], [1, 0], [0, 0]])
    # nodes: 1=[0] 2=[1] 3=[0,0] 4=[0,1] 5=[1,0] 6=[0,0,0]
    assert t.tree.parents == (0, 0, 1, 1, 2, 3)
    assert t.tree.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert t.heads == (0, 0, 1, 1, 1, 2) and t.ranks == (0, 1, 0, 1, 0, 0)
    assert t.topk_per_head() == [2, 2, 1]
    with pytest.raises(ChoicesError, match=r"no parent \[0, 1\]"):
        tree_from_choices([[0], [0, 1, 0]])
    with pytest.raises(ChoicesError, match="unknown Medusa choices"):
        load_choices("mc_sim_7b_64")


def test_published_trees():
    for name in ("mc_sim_7b_63", "vicuna_7b_stage2"):
        t = tree_from_choices(load_choices(name))
        assert len(t.tree) == 63 and t.depth == 4
        assert t.tree.depths.bincount().tolist()[1:] == [
            sum(len(c) == d for c in load_choices(name)) for d in (1, 2, 3, 4)]
    assert tree_from_choices(load_choices("mc_sim_7b_63")).topk_per_head() == [10, 10, 10, 2]
    source = json.loads((ROOT / "data/medusa/medusa_trees.json").read_text())["_source"]
    assert "FasterDecoding/Medusa" in source


@pytest.fixture
def tiny_heads_dir(tiny_llama, tmp_path):
    """Random 3-head checkpoint (own projections) for the tiny Llama: drafts are junk but exercised."""
    cfg = tiny_llama.config
    heads = MedusaHeads(3, cfg.hidden_size, cfg.vocab_size)
    torch.manual_seed(2)
    for p in heads.parameters():
        nn.init.normal_(p, std=0.5)
    return save_heads(heads, tmp_path / "tiny", dtype=torch.float32)


def test_drafts_come_from_the_hidden_state_of_the_last_accepted_row(tiny_llama, tiny_heads_dir):
    choices = [[0], [1], [0, 0], [0, 2], [1, 0], [0, 0, 1]]
    drafter = build_drafter("medusa", vocab_size=97, model=tiny_llama, model_name="tiny",
                            heads=str(tiny_heads_dir), choices=choices, device="cpu", dtype_name="float32")
    assert drafter.lossless and reads_hidden_states(drafter)
    h = torch.randn(5, 32)
    drafter.observe_prefill(h)
    draft = drafter.propose(DecodeState(tokens=torch.tensor([1, 2]), prompt_len=2, step=0))
    with torch.no_grad():
        top = drafter.heads(h[-1]).topk(3, dim=-1).indices
    tree = tree_from_choices(choices)
    assert draft.tree.parents == tree.tree.parents
    assert draft.tokens.tolist() == [int(top[hd, r]) for hd, r in zip(tree.heads, tree.ranks)]

    rows = torch.randn(len(choices) + 1, 32)
    drafter.observe(StepOutcome(draft=draft, root=1, logits=torch.zeros(7, 97), accepted=[2, 5], bonus=3,
                                hidden_states=rows))
    assert torch.equal(drafter._hidden, rows[5:6])  # node 5 was accepted last: its row chose the bonus
    drafter.observe(StepOutcome(draft=draft, root=1, logits=torch.zeros(7, 97), accepted=[], bonus=3,
                                hidden_states=rows))
    assert torch.equal(drafter._hidden, rows[0:1])
    with pytest.raises(MedusaHeadsError, match="3 deep but only 2 head"):
        build_drafter("medusa", vocab_size=97, model=tiny_llama, heads=str(tiny_heads_dir), choices=choices,
                      num_heads=2)


def test_equals_ar_on_tiny_llama(tiny_llama, tiny_heads_dir):
    engine = Engine(tiny_llama, eos_token_ids=[])
    # mc_sim_7b_63 needs 4 heads; the tiny checkpoint has 3, so use a depth-3 slice of it.
    choices = [c for c in load_choices("mc_sim_7b_63") if len(c) <= 3]
    drafter = Medusa(vocab_size=97, model=tiny_llama, heads=str(tiny_heads_dir), choices=choices)
    prompt = [5, 17, 33, 2, 8, 64, 12]
    ar = engine.generate(prompt, Autoregressive(), 40)
    out = engine.generate(prompt, drafter, 40)
    assert out.tokens == ar.tokens
    assert all(rows == 1 + len(choices) for rows in out.step_rows)


def test_typical_acceptance_is_flagged_lossy_and_takes_the_deepest_plausible_path(tiny_llama, tiny_heads_dir):
    greedy = Medusa(vocab_size=97, model=tiny_llama, heads=str(tiny_heads_dir), choices=[[0]])
    typical = Medusa(vocab_size=97, model=tiny_llama, heads=str(tiny_heads_dir), choices=[[0]], typical=True,
                     typical_temperature=1.0)
    assert greedy.lossless and not typical.lossless
    # tree: 1=A (root child), 2=B (root child), 3=C (child of 1), 4=D (child of 2), 5=E (child of 4)
    tree = DraftTree([0, 0, 1, 2, 4])
    A, B, C, D, E = 10, 11, 12, 13, 14
    draft = Draft(tokens=torch.tensor([A, B, C, D, E]), tree=tree)
    logits = torch.full((6, 97), -10.0)
    logits[0, [A, B, 50]] = torch.tensor([2.0, 1.5, 2.5])  # root: argmax 50; A and B both plausible
    logits[1, [C, 60]] = torch.tensor([-5.0, 5.0])          # under A: C implausible
    logits[2, [D, 61]] = torch.tensor([1.0, 1.2])           # under B: D plausible
    logits[4, [E, 62]] = torch.tensor([1.0, 1.1])           # under D: E plausible
    logits[5, 63] = 4.0                                     # under E: the target's own choice
    targets = logits.argmax(-1)
    assert greedy.override_targets(draft, logits, targets) is targets
    assert accept_path(tree, draft.tokens.tolist(), targets.tolist()) == ([], 50)  # greedy accepts nothing
    new = typical.override_targets(draft, logits, targets)
    assert accept_path(tree, draft.tokens.tolist(), new.tolist()) == ([2, 4, 5], 63)  # B, D, E, then the bonus
    assert typical.override_targets(draft, logits, targets.tolist()) == new.tolist()
    # Nothing plausible below the root: the engine's own targets stand.
    flat = torch.zeros(6, 97)
    flat[:, 90] = 30.0
    assert torch.equal(typical.override_targets(draft, flat, flat.argmax(-1)), flat.argmax(-1))


def test_training_smoke_lowers_the_loss(real_model, tmp_path):
    """Two optimiser steps of the training script on a tiny random Llama (with the real tokenizer):
    prompts, greedy data with cached hidden states, training, saving, reading back."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tok, _ = real_model
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    sys.path.insert(0, str(ROOT / "scripts"))
    import train_medusa

    info = train_medusa.main([
        "--model", "hf", "--model-path", str(tmp_path / "tiny"), "--out", str(tmp_path / "heads"),
        "--cache-dir", str(tmp_path / "cache"), "--num-prompts", "8", "--max-new-tokens", "6",
        "--batch-size", "4", "--held-out", "0.25", "--max-steps", "3", "--train-batch-size", "100000",
        "--lr", "1e-2", "--log-every", "1"])
    losses = [h["loss"] for h in info["history"]]
    assert len(losses) == 3 and losses[2] < losses[1] < losses[0]  # full-batch steps: each one helps
    assert len(list((tmp_path / "cache").glob("batch_*.pt"))) == 2  # hidden states cached per batch
    heads = load_heads(tmp_path / "heads")
    assert heads.shared_projection and heads.num_heads == 4
    assert info["train_rows"] > 0 and info["eval_rows"] > 0

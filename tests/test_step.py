"""The shared step pieces (specbench/decoding/step.py): the stop at EOS or the budget, the split of a
verification piece into accepted nodes and emitted tokens, and both engines emitting the same tokens
through them."""

from __future__ import annotations

import gc

import pytest
import torch

from specbench.decoding.batched import BatchedEngine, Request
from specbench.decoding.step import (ModelFacts, TreeTensorCache, cut_at_stop, greedy_targets, split_piece,
                                     verify_piece)
from specbench.decoding.verify import accept_path
from specbench.draft import Draft, DraftTree
from specbench.drafter import Drafter
from tests.test_batched import EOS, METHODS, alone, tiny_prompts

TREE = DraftTree((0, 0, 1, 1, 2, 3))  # root -> 1, 2; 1 -> 3, 4; 2 -> 5; 3 -> 6 (max depth 3)


@pytest.mark.parametrize("emitted, produced, budget, want", [
    ([5, 6, 7], 0, 10, [5, 6, 7]),  # neither: all of it
    ([5, 3, 7], 0, 10, [5, 3]),  # EOS kept, what follows it dropped
    ([5, 6, 7], 8, 10, [5, 6]),  # the budget fills at the second token
    ([3, 6, 7], 9, 10, [3]),  # both at once
    ([5], 0, 1, [5]),
])
def test_cut_at_stop(emitted, produced, budget, want):
    assert cut_at_stop(emitted, {3}, produced, budget) == want


def test_split_piece():
    # path root -> 1 -> 4 (depth 3 unreached: 0), then the targets at root, 1, 4 and a stale one
    assert split_piece([0, 1, 4, 0, 40, 41, 44, 40], Draft(tokens=torch.zeros(6), tree=TREE)) == \
        ([1, 4], [40, 41, 44])
    assert split_piece([0, 0, 0, 0, 40, 40, 40, 40], Draft(tokens=torch.zeros(6), tree=TREE)) == ([], [40])
    assert split_piece([0, 2, 5, 0, 40, 42, 45, 40], Draft(tokens=torch.zeros(6), tree=TREE)) == \
        ([2, 5], [40, 42, 45])
    assert split_piece([8], None) == ([], [8])


@pytest.mark.parametrize("seed", range(8))
def test_verify_then_split_is_accept_path(seed):
    """On the device rule and its host split together: the plain-Python rule's accepted nodes and
    tokens, for drafts that agree with the targets partly (a random draft rarely would)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(TREE.size, 11, generator=g)
    targets = logits.argmax(-1).tolist()
    # each node takes its parent's target with probability 1/2, else a random token
    tokens = [targets[p] if torch.rand(1, generator=g) < 0.5 else int(torch.randint(0, 11, (1,), generator=g))
              for p in TREE.parents]
    draft = Draft(tokens=torch.tensor(tokens), tree=TREE)
    rows = torch.tensor([7] + tokens)
    piece = verify_piece(TreeTensorCache("cpu"), logits, draft, rows, 5, greedy_targets, Drafter(), "cpu")
    assert piece.shape == (2 * (TREE.max_depth + 1),)
    accepted, bonus = accept_path(TREE, tokens, targets)
    assert split_piece(piece.tolist(), draft) == (accepted, [tokens[a - 1] for a in accepted] + [bonus])
    plain = verify_piece(TreeTensorCache("cpu"), logits[:1], None, rows[:1], 5, greedy_targets, Drafter(), "cpu")
    assert split_piece(plain.tolist(), None) == ([], [targets[0]])


def test_tree_tensor_cache_makes_each_tree_once_and_forgets_it():
    cache = TreeTensorCache("cpu")
    tree = DraftTree((0, 1))
    tt = cache(tree)
    assert cache(tree) is tt and cache(DraftTree((0, 1))) is not tt
    del tree, tt
    gc.collect()
    assert len(cache._trees) == 0


def test_model_facts(tiny_llama, tiny_gemma):
    assert ModelFacts.of(tiny_llama) == ModelFacts(None, torch.float32, 256)
    assert ModelFacts.of(tiny_gemma) == ModelFacts(4, torch.float32, 256)  # sliding and full layers mix


def test_both_engines_emit_the_same_tokens(tiny_llama):
    prompts = tiny_prompts([6, 11, 4], seed=3)
    budgets = [14, 9, 12]
    makes = [METHODS["tr[prefill]"], METHODS["pld"], METHODS["ar"]]
    refs = [alone(tiny_llama, EOS, p, make, n) for p, make, n in zip(prompts, makes, budgets)]
    engine = BatchedEngine(tiny_llama, EOS)
    assert not hasattr(engine, "engine")  # no single-request engine behind it any more
    out = engine.generate([Request(p, n, make) for p, n, make in zip(prompts, budgets, makes)], max_batch=3)
    for rec, ref in zip(out.records, refs):
        assert (rec.tokens, rec.accept_lengths) == (ref.tokens, ref.accept_lengths)
    assert max(s.active for s in out.steps) == 3

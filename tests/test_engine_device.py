"""The engine's on-device pieces against their host references: the verification (accepted path and
emitted tokens) and the attention masks. On a CUDA machine, the whole loop on the GPU too."""

import random

import pytest
import torch

from specbench.methods.ar import Autoregressive
from specbench.methods.tr.base import TokenRecycling
from specbench.draft import Draft
from specbench.drafter import Drafter
from specbench.decoding.engine import Engine
from specbench.draft import DraftTree
from specbench.decoding.masks import tree_attention_mask
from specbench.decoding.verify import TreeTensors, accept_path, accepted_path


def random_tree(rng: random.Random, n: int) -> DraftTree:
    return DraftTree(tuple(rng.randint(0, i) for i in range(n)))


def test_device_verification_equals_accept_path():
    rng = random.Random(0)
    for trial in range(300):
        tree = random_tree(rng, rng.randint(1, 25))
        vocab = rng.choice([2, 3, 5])  # small vocabularies: many matches and duplicate siblings
        tokens = [rng.randrange(vocab) for _ in range(len(tree))]
        targets = [rng.randrange(vocab) for _ in range(tree.size)]
        want_path, want_bonus = accept_path(tree, tokens, targets)
        tt = TreeTensors(tree, torch.device("cpu"))
        by_depth = accepted_path(tt, torch.tensor(tokens), torch.tensor(targets)).tolist()
        assert by_depth[0] == 0
        assert [a for a in by_depth[1:] if a] == want_path, trial
        assert by_depth[1 + len(want_path):] == [0] * (len(by_depth) - 1 - len(want_path))
        last = want_path[-1] if want_path else 0
        assert targets[last] == want_bonus


def test_engine_verify_returns_path_and_emitted_tokens(tiny_llama):
    engine = Engine(tiny_llama, eos_token_ids=[])
    tree = DraftTree((0, 0, 1, 2))  # root -> 1, 2; 1 -> 3; 2 -> 4
    draft = Draft(tokens=torch.tensor([7, 8, 9, 10]), tree=tree)
    logits = torch.zeros(5, 20)
    for row, tok in enumerate([8, 0, 10, 0, 13]):  # root wants 8 (node 2), node 2 wants 10 (node 4)
        logits[row, tok] = 1.0

    def greedy(lg, pos):
        return lg.argmax(-1)

    ids = torch.cat([torch.tensor([5]), draft.tokens])  # the forward's rows: root, then the draft
    accepted, emitted, path = engine._verify(logits, draft, ids, 3, greedy, Drafter())
    assert (accepted, emitted, path.tolist()) == ([2, 4], [8, 10, 13], [0, 2, 4])
    assert engine._verify(logits[:1], None, ids[:1], 3, greedy, Drafter()) == ([], [8], None)
    as_list = lambda lg, pos: lg.argmax(-1).tolist()  # noqa: E731 - a sampler returning host ints
    assert engine._verify(logits, draft, ids, 3, as_list, Drafter())[:2] == ([2, 4], [8, 10, 13])


@pytest.mark.parametrize("window", [None, 3])
def test_device_masks_equal_tree_attention_mask(tiny_llama, window):
    engine = Engine(tiny_llama, eos_token_ids=[])
    engine.sliding_window = window
    tree = DraftTree((0, 0, 1, 1, 2))
    tt = engine.tree_tensors(tree)
    for cache_len in (0, 2, 9):
        got = engine._mask(tt.ancestors, tt.depths, cache_len)
        full = got if window is None else got["full_attention"]
        ref = tree_attention_mask(tree.ancestor_mask, tree.depths, cache_len, torch.float32, "cpu")
        assert torch.equal(full, ref)
        if window is not None:
            ref_s = tree_attention_mask(tree.ancestor_mask, tree.depths, cache_len, torch.float32, "cpu", window)
            assert torch.equal(got["sliding_attention"], ref_s)
    assert engine.tree_tensors(tree) is tt  # made once per tree


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tr_on_cuda_equals_ar_on_cuda(tiny_llama, dtype):
    import copy

    model = copy.deepcopy(tiny_llama).to("cuda", dtype)
    engine = Engine(model, eos_token_ids=[])
    prompt = list(range(3, 20))
    ar = engine.generate(prompt, Autoregressive(), 40)
    tr = TokenRecycling(vocab_size=97, device="cuda")
    for _ in range(2):
        out = engine.generate(prompt, tr, 40)
        assert out.tokens == ar.tokens
    assert max(out.accept_lengths) > 1

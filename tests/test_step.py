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
from specbench.decoding.verify import accept_path, accepted_path
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


@pytest.mark.parametrize("seed", range(8))
def test_the_host_walk_gives_the_device_piece_and_chooses_only_the_path_s_rows(seed):
    """On a CPU the tree is walked and a row's target chosen only when the walk reaches it: the same
    piece, value for value, as the device's rule over every row, and `select` called for the root and
    the accepted nodes' rows alone."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(TREE.size, 11, generator=g)
    targets = logits.argmax(-1)
    tokens = [int(targets[p]) if torch.rand(1, generator=g) < 0.6 else int(torch.randint(0, 11, (1,), generator=g))
              for p in TREE.parents]
    draft = Draft(tokens=torch.tensor(tokens), tree=TREE)
    rows = torch.tensor([7] + tokens)
    asked = []

    def select(scores, positions):
        asked.append(int(positions[0]) - 5)  # the row's depth: positions are 5 + depth
        return greedy_targets(scores, positions)

    piece = verify_piece(TreeTensorCache("cpu"), logits, draft, rows, 5, select, Drafter(), "cpu")
    path = accepted_path(TreeTensorCache("cpu")(TREE), rows[1:], targets)
    assert piece.tolist() == torch.cat([path, targets[path]]).tolist()
    accepted, _ = accept_path(TREE, tokens, targets.tolist())
    assert asked == [0] + [int(TREE.depths[a]) for a in accepted]  # one row per depth reached, no other


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


# -- the fixed-shape step's buffers, mask and runners (static_step.py), checked on the CPU ------------

def _engine_mask(draft, base, capacity, window=None):
    """The eager engine's mask for `draft`'s real rows, widened to the whole buffer (hidden columns)."""
    from specbench.decoding.engine import Engine
    from specbench.decoding.masks import tree_attention_mask

    tt = TreeTensorCache("cpu")(draft.tree)
    vis, depths = tt.ancestors, tt.depths
    if draft.n_extra:
        n, e = draft.tree.size, draft.tree.size + draft.n_extra
        vis = torch.zeros(e, e, dtype=torch.bool)
        vis[:n, :n] = tt.ancestors
        vis[n:] = draft.extra_visibility
        depths = torch.cat([depths, draft.extra_depths])
    m = tree_attention_mask(vis, depths, base, torch.float32, sliding_window=window)
    out = torch.full((1, 1, m.shape[2], capacity), torch.finfo(torch.float32).min)
    out[..., : m.shape[3]] = m
    return out


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("extra", [False, True])
def test_a_filled_bucket_gives_the_engines_mask_and_positions_on_the_device(window, extra):
    """The fixed-shape forward's mask, made from the buffers and the cache's length alone, equals the
    eager engine's for the real rows; padded rows see the prefix and themselves, nothing later."""
    from specbench.decoding.static_step import StepBuffers, graph_mask

    g = torch.Generator().manual_seed(3)
    draft = Draft(tokens=torch.randint(0, 97, (len(TREE),), generator=g), tree=TREE)
    if extra:  # two Jacobi-like rows: the first sees the root, the second the first and itself
        draft = Draft(tokens=draft.tokens, tree=TREE, extra_tokens=torch.tensor([11, 12]),
                      extra_depths=torch.tensor([1, 2]),
                      extra_visibility=torch.tensor([[1, 0, 0, 0, 0, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0, 0, 1, 1]],
                                                    dtype=torch.bool))
    bufs, base, capacity = StepBuffers(16, "cpu"), 9, 40
    r = bufs.fill(5, draft, TreeTensorCache("cpu"))
    assert r == TREE.size + draft.n_extra and bufs.ids[0, 0] == 5
    assert torch.equal(bufs.ids[0, 1 : TREE.size], draft.tokens)
    mask = graph_mask(torch.tensor(base), bufs.depths, bufs.visibility, capacity, torch.float32, window)
    want = _engine_mask(draft, base, capacity, window)
    got = mask if window is None else mask["sliding_attention"]
    assert torch.equal(got[..., :r, :], want)
    if window is not None:
        assert torch.equal(mask["full_attention"][..., :r, :], _engine_mask(draft, base, capacity))
    lo = torch.finfo(torch.float32).min
    pad = (mask if window is None else mask["full_attention"])[0, 0, r:]
    assert (pad[:, :base] == 0).all() and (pad[:, base + 16 :] == lo).all()
    assert all(pad[i, base + r + i] == 0 and (pad[i, base : base + 16] == 0).sum() == 1 for i in range(16 - r))


def test_buffers_rewrite_the_tree_only_when_it_changes():
    from specbench.decoding.static_step import StepBuffers

    trees = TreeTensorCache("cpu")
    bufs = StepBuffers(8, "cpu")
    chain = DraftTree.chain(3)
    assert bufs.fill(7, Draft(tokens=torch.tensor([1, 2, 3]), tree=chain), trees) == 4
    assert bufs.layout is chain and bufs.depths.tolist() == [0, 1, 2, 3, 0, 0, 0, 0]
    bufs.depths[5] = 99  # a write the next fill of the same tree must not undo: nothing rewritten
    assert bufs.fill(8, Draft(tokens=torch.tensor([4, 5, 6]), tree=chain), trees) == 4
    assert bufs.depths[5] == 99 and bufs.ids[0, :4].tolist() == [8, 4, 5, 6]
    assert bufs.fill(9, None, trees) == 1  # a plain step: the root alone, layout reset
    assert bufs.layout is None and bufs.depths.tolist() == [0] * 8 and torch.equal(bufs.visibility, torch.eye(8).bool())
    with pytest.raises(ValueError, match="does not fit"):
        bufs.fill(1, Draft(tokens=torch.arange(8), tree=DraftTree.chain(8)), trees)


def test_runners_are_built_once_per_key_and_a_failed_capture_falls_back_with_one_warning(capsys):
    from specbench.decoding.static_step import Runners

    built = []

    def build(key, cache, length):
        built.append(key)
        return lambda c: ("plain", key)

    def graph(key, plain, cache, length):
        if key[1] == 16:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        return lambda c: ("graph", key)

    runners = Runners(build, graph)
    assert runners.get((1024, 1, False), "cache", 0)(None) == ("graph", (1024, 1, False))
    assert runners.get((1024, 1, False), "cache", 5)(None)[0] == "graph"
    assert runners.get((1024, 16, False), "cache", 0)(None) == ("plain", (1024, 16, False))
    assert runners.get((1024, 16, False), "cache", 0)(None)[0] == "plain"
    assert built == [(1024, 1, False), (1024, 16, False)] and runners.captured == {(1024, 1, False)}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: capturing the forward as a CUDA graph failed")
    assert "not permitted" in err[0] and "continuing" in err[0]
    assert Runners(build, None).get((2048, 1, True), "cache", 0)(None)[0] == "plain"  # the CPU: no graphs

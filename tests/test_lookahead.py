"""Lookahead Decoding: window layout and visibility, the forward the engine builds for a draft with
extra rows, window warm-up and update, the n-gram pool, candidate tries, and equality with AR."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from specbench.methods.ar import Autoregressive
from specbench.methods.lookahead import Lookahead, NgramPool, candidate_tree, top_level_rows, window_layout
from specbench.draft import DecodeState, StepOutcome
from specbench.decoding.engine import Engine
from specbench.decoding.kv_cache import with_cache
from specbench.registry import build_drafter
from specbench.decoding.sampling import PositionSampler
from specbench.draft import DraftTree
from specbench.decoding.verify import accept_path

T = lambda *xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731


# -- layout ----------------------------------------------------------------------------------------

def test_visibility_n3_w3():
    """N=3 (2 levels), W=3. Columns: root, (0,1), (0,2), (1,0), (1,1), (1,2)."""
    cells, depths, vis = window_layout(2, 3)
    assert cells == ((0, 1), (0, 2), (1, 0), (1, 1), (1, 2))
    expected = [
        [1, 1, 0, 0, 0, 0],  # (0,1): root, itself
        [1, 1, 1, 0, 0, 0],  # (0,2): root, (0,1), itself
        [1, 0, 0, 1, 0, 0],  # (1,0): level 0 up to column 0 = root; column 0 of level 1
        [1, 1, 0, 0, 1, 0],  # (1,1): root, (0,1); column 1 of level 1
        [1, 1, 1, 0, 0, 1],  # (1,2): root, (0,1), (0,2); column 2 of level 1
    ]
    assert vis.int().tolist() == expected
    assert depths.tolist() == [1, 2, 1, 2, 3]


def test_visibility_n4_w2():
    """N=4 (3 levels), W=2. Columns: root, (0,1), (1,0), (1,1), (2,0), (2,1)."""
    cells, depths, vis = window_layout(3, 2)
    assert cells == ((0, 1), (1, 0), (1, 1), (2, 0), (2, 1))
    expected = [
        [1, 1, 0, 0, 0, 0],  # (0,1)
        [1, 0, 1, 0, 0, 0],  # (1,0): root; (1,0)
        [1, 1, 0, 1, 0, 0],  # (1,1): root, (0,1); (1,1)
        [1, 0, 1, 0, 1, 0],  # (2,0): root; (1,0), (2,0)
        [1, 1, 0, 1, 0, 1],  # (2,1): root, (0,1); (1,1), (2,1)
    ]
    assert vis.int().tolist() == expected
    assert depths.tolist() == [1, 1, 2, 2, 3]


def test_warmup_window_is_one_causal_level():
    cells, depths, vis = window_layout(1, 4)
    assert cells == ((0, 1), (0, 2), (0, 3))
    assert vis.int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert depths.tolist() == [1, 2, 3]


def test_top_level_rows():
    # forward rows: root 0, tree nodes 1..n_tree, then extras in window_layout order
    assert top_level_rows(1, 4, 2) == [0, 3, 4, 5]  # warm-up: the root and level 0
    assert top_level_rows(2, 3, 1) == [4, 5, 6]  # extras (0,1),(0,2) at rows 2,3
    assert top_level_rows(3, 2, 5) == [9, 10]  # (0,1) 6, (1,0) 7, (1,1) 8


def test_bad_settings():
    for kw, msg in (({"N": 1}, "N >= 2"), ({"W": 0}, "W >= 1"), ({"G": -1}, "G >= 0")):
        with pytest.raises(ValueError, match=msg):
            Lookahead(vocab_size=10, **kw)


# -- the forward the engine runs for a draft with extra rows ----------------------------------------

def test_engine_forward_with_window_matches_sequential(tiny_llama):
    model = tiny_llama
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (11,), generator=g).tolist()
    root = ids[-1]
    d = Lookahead(vocab_size=97, N=4, W=3, G=3)
    d.levels = [[root, 5, 6], [7, 8, 9], [10, 11, 12]]  # a full window: 3 levels x 3 columns
    for gram in ((40, 41, 42), (40, 41, 43), (50, 51, 52)):  # a trie with two branch points
        d.pool.add(root, gram)
    draft = d.propose(DecodeState(tokens=torch.tensor(ids), prompt_len=6, step=1))
    tree, n = draft.tree, draft.tree.size
    assert draft.tokens.tolist() == [40, 41, 42, 43, 50, 51, 52] and tree.parents == (0, 1, 2, 2, 0, 5, 6)
    assert draft.extra_tokens.tolist() == [5, 6, 7, 8, 9, 10, 11, 12]

    seen = {}

    def grab(module, args, kwargs):
        seen["mask"], seen["pos"] = kwargs["attention_mask"], kwargs["position_ids"]

    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([ids[:-1]]), **with_cache(model, cache), use_cache=True)
    hook = model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        logits, _ = Engine(model, [0]).forward_rows(cache, len(ids) - 1, draft, root)
    finally:
        hook.remove()

    cache_len, rows = len(ids) - 1, n + draft.n_extra
    allowed = (seen["mask"][0, 0] == 0)
    assert allowed.shape == (rows, cache_len + rows)
    assert allowed[:, :cache_len].all()  # everyone sees the cached prefix
    new = allowed[:, cache_len:]
    assert not new[:n, n:].any()  # tree rows never see window rows
    assert not new[n:, 1:n].any()  # window rows never see tree nodes
    assert new[n:, 0].all()  # ... but all see the root
    assert torch.equal(new[:n, :n], tree.ancestor_mask)
    assert torch.equal(new[n:, n:], window_layout(3, 3)[2][:, 1:])  # cells see their allowed cells
    assert seen["pos"][0].tolist() == [cache_len + int(x) for x in torch.cat([tree.depths, draft.extra_depths])]

    toks = draft.tokens.tolist()
    expect_seq = {0: []}
    for node in range(1, n):
        expect_seq[node] = [toks[i - 1] for i in tree.path_to(node)]
    cells, _, _ = window_layout(3, 3)
    lv = d.levels
    for i, (l, c) in enumerate(cells):  # what cell (l, c) sees, in position order
        expect_seq[n + i] = lv[0][1 : c + 1] + [lv[k][c] for k in range(1, l + 1)]
    for row, seq in expect_seq.items():
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([ids + seq])).logits[0, -1]
        torch.testing.assert_close(logits[row], ref, atol=1e-4, rtol=1e-4, msg=f"row {row}")


# -- window warm-up and update ---------------------------------------------------------------------

def _step(d: Lookahead, tokens: list[int], step: int, preds, emitted=None, accepted=None):
    """propose, then observe logits whose argmax at forward row r is preds(r)."""
    draft = d.propose(DecodeState(tokens=torch.tensor(tokens), prompt_len=3, step=step))
    rows = draft.tree.size + draft.n_extra
    logits = torch.zeros(rows, 200)
    for r in range(rows):
        logits[r, preds(r)] = 1.0
    d.observe(StepOutcome(draft=draft, root=tokens[-1], logits=logits, accepted=accepted or [],
                          bonus=0, emitted=emitted or [0]))
    return draft


def test_warmup_then_full_window():
    N, W = 4, 3
    d = Lookahead(vocab_size=200, N=N, W=W, G=4, seed=3)
    prompt = [7, 8, 9, 10, 11]
    d.propose(DecodeState(tokens=torch.tensor(prompt), prompt_len=5, step=0))
    assert [len(lv) for lv in d.levels] == [W + N - 2]  # one level: root + W + N - 3 prompt tokens
    assert d.levels[0][0] == 11 and set(d.levels[0][1:]) <= set(prompt)

    d = Lookahead(vocab_size=200, N=N, W=W, G=4, seed=3)
    # warm-up step 1: a new level from the top level's predictions minus the first; one column less.
    # Rows: root 0, stand-in 1, level 0 columns 1..4 at rows 2..5
    _step(d, prompt, 0, lambda r: 100 + r)
    assert [len(lv) for lv in d.levels] == [W + N - 3] * 2
    assert d.levels[1] == [102, 103, 104, 105]
    assert len(d.pool) == 0  # warm-up adds nothing to the pool
    before = [lv[:] for lv in d.levels]
    _step(d, prompt + [50], 1, lambda r: 150 + r)
    assert [len(lv) for lv in d.levels] == [W] * (N - 1)  # full: N-1 levels of W columns
    assert d.levels[:2] == [lv[1:] for lv in before]
    # rows: root 0, stand-in 1, level 0 columns 1..3 at 2..4, level 1 columns 0..3 at 5..8
    assert d.levels[2] == [156, 157, 158]
    assert len(d.pool) == 0


def test_full_window_feeds_pool_and_moves_down():
    d = Lookahead(vocab_size=200, N=3, W=3, G=2)
    d.levels = [[0, 11, 12], [20, 21, 22]]
    # pool empty: the stand-in candidate is the window's guess for the next position, cell (1, 0)
    draft = _step(d, [1, 2, 5], 1, lambda r: {4: 30, 5: 31, 6: 32}.get(r, 0))
    assert draft.tokens.tolist() == [20] and d.stats["stand_in_steps"] == 1
    # one n-gram per column: (level-0 token; level 1 .. top, prediction), column 0 keyed by the root
    assert d.pool.get(5) == [(20, 30)] and d.pool.get(11) == [(21, 31)] and d.pool.get(12) == [(22, 32)]
    assert d.levels == [[20, 21, 22], [30, 31, 32]]  # level 0 dropped, each level moved down one
    # several tokens accepted: the window still moves one level (the original's greedy path)
    d.pool.add(9, (20, 21))
    draft = _step(d, [1, 2, 5, 9], 2, lambda r: 60 + r, emitted=[20, 21, 4], accepted=[1, 2])
    assert draft.tokens.tolist() == [20, 21]
    assert d.levels == [[30, 31, 32], [65, 66, 67]]  # top rows: after root, 2 nodes, (0,1), (0,2)
    assert d.stats["stand_in_accepted"] == 0


def test_pool_lru_and_eviction():
    pool = NgramPool(2)
    pool.add(1, (2, 3))
    pool.add(1, (4, 5))
    assert pool.get(1) == [(2, 3), (4, 5)]  # oldest first
    pool.add(1, (2, 3))  # re-inserting refreshes: now the newest
    assert pool.get(1) == [(4, 5), (2, 3)]
    pool.add(1, (6, 7))  # full: the least recently inserted goes
    assert pool.get(1) == [(2, 3), (6, 7)]
    pool.add(8, (9, 9))
    assert len(pool) == 3 and pool.get(42) == []
    none = NgramPool(0)
    none.add(1, (2, 3))
    assert len(none) == 0


# -- verification branch ---------------------------------------------------------------------------

def test_candidate_trie_vs_flat_rows():
    grams = [(5, 6, 7), (5, 6, 8), (5, 9, 1)]
    tokens, parents = candidate_tree(grams, merge=True)
    assert tokens == [5, 6, 7, 8, 9, 1] and parents == [0, 1, 2, 2, 1, 5]
    ftokens, fparents = candidate_tree(grams, merge=False)
    assert ftokens == [5, 6, 7, 5, 6, 8, 5, 9, 1] and fparents == [0, 1, 2, 0, 4, 5, 0, 7, 8]

    # the target continues 5 6 8 then 3: the trie accepts the longest row; flat rows stop at the
    # first sibling whose first tokens match (5 6), one token short
    def targets(tok, par, want):
        out = [want[0]]
        for i in range(len(tok)):
            depth = len(DraftTree(par).path_to(i + 1))
            path = [tok[j - 1] for j in DraftTree(par).path_to(i + 1)]
            out.append(want[depth] if path == list(want[:depth]) else -1)
        return out

    want = (5, 6, 8, 3)
    acc, bonus = accept_path(DraftTree(parents), tokens, targets(tokens, parents, want))
    assert [tokens[a - 1] for a in acc] == [5, 6, 8] and bonus == 3
    acc, bonus = accept_path(DraftTree(fparents), ftokens, targets(ftokens, fparents, want))
    assert [ftokens[a - 1] for a in acc] == [5, 6] and bonus == 8


def test_drafter_verifies_the_roots_ngrams():
    d = Lookahead(vocab_size=200, N=3, W=2, G=3)
    d.levels = [[0, 1], [2, 3]]
    d.pool.add(5, (6, 7))
    d.pool.add(5, (6, 8))
    d.pool.add(4, (9, 9))
    draft = d.propose(DecodeState(tokens=T(1, 2, 5), prompt_len=2, step=1))
    assert draft.tokens.tolist() == [6, 7, 8] and draft.tree.parents == (0, 1, 1)
    d.settings = dataclasses.replace(d.settings, merge_candidates=False)
    draft = d.propose(DecodeState(tokens=T(1, 2, 5), prompt_len=2, step=1))
    assert draft.tokens.tolist() == [6, 7, 6, 8] and draft.tree.parents == (0, 1, 0, 3)


# -- pool lifetime and seeding ---------------------------------------------------------------------

@pytest.mark.parametrize("lifetime, kept_next_turn, kept_next_question",
                         [("turn", False, False), ("question", True, False), ("run", True, True)])
def test_pool_lifetime(lifetime, kept_next_turn, kept_next_question):
    d = build_drafter("lookahead", vocab_size=50, pool=lifetime)
    d.start_question()
    d.propose(DecodeState(tokens=T(3, 1), prompt_len=2, step=0))  # turn 1
    d.pool.add(1, (2, 3, 4, 5))
    d.propose(DecodeState(tokens=T(3, 1, 7, 3, 1), prompt_len=5, step=0))  # turn 2 of the question
    assert d.pool.get(1) == ([(2, 3, 4, 5)] if kept_next_turn else [])
    d.pool.add(1, (2, 3, 4, 5))
    d.start_question()
    assert d.levels is None  # the window always starts afresh
    assert d.pool.get(1) == ([(2, 3, 4, 5)] if kept_next_question else [])


def test_unknown_pool_lifetime_is_refused():
    with pytest.raises(ValueError, match="turn, question, run"):
        build_drafter("lookahead", vocab_size=50, pool="forever")


def test_prompt_ngrams_seed_and_follow_the_output():
    d = Lookahead(vocab_size=50, N=3, W=2, G=4, prompt_ngrams=True)
    d.start_question()
    draft = d.propose(DecodeState(tokens=T(1, 2, 3, 1, 2, 4, 1), prompt_len=7, step=0))
    assert d.pool.get(1) == [(2, 3), (2, 4)] and d.pool.get(2) == [(3, 1), (4, 1)]
    assert draft.tokens.tolist() == [2, 3, 4]  # the root 1's n-grams, as a trie
    d.propose(DecodeState(tokens=T(1, 2, 3, 1, 2, 4, 1, 2, 5), prompt_len=7, step=1))
    assert d.pool.get(1) == [(2, 3), (2, 4), (2, 5)] and d.pool.get(4) == [(1, 2)]
    plain = Lookahead(vocab_size=50, N=3, W=2, G=4)
    plain.propose(DecodeState(tokens=T(1, 2, 3, 1, 2, 4, 1), prompt_len=7, step=0))
    assert len(plain.pool) == 0


# -- equality with AR ------------------------------------------------------------------------------

CONFIGS = [dict(N=3, W=3, G=3), dict(N=5, W=4, G=4, merge_candidates=False), dict(N=2, W=4, G=2),
           dict(N=4, W=2, G=5, prompt_ngrams=True)]


def test_equals_ar_on_tiny_model(tiny_llama):
    """Greedy and sampled, several window shapes, flat rows, N=2 (plain Jacobi guesses), prompt n-grams."""
    engine = Engine(tiny_llama, [0])
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, 97, (12,), generator=g).tolist() for _ in range(2)]
    samplers = [None, PositionSampler(0.8, seed=5)]
    ar = {(p, s): engine.generate(prompts[p], Autoregressive(), 32, samplers[s]).tokens
          for p in range(2) for s in range(2)}
    for kw in CONFIGS:
        d = Lookahead(vocab_size=97, **kw)
        accepted = 0
        for (p, s), expect in ar.items():
            d.start_question()
            out = engine.generate(prompts[p], d, 32, samplers[s])
            assert out.tokens == expect, (kw, p, s)
            accepted += sum(out.accept_lengths) - len(out.accept_lengths)
        assert accepted > 0, kw

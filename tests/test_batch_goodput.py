"""The batch speculation policy (speculation/batch_policy.py): the row budget, sub-trees, rates, and
losslessness when it cuts drafts inside the batched engine."""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.batched import BatchedEngine, Request
from specbench.decoding.engine import Engine
from specbench.draft import DraftTree, DecodeState, Draft
from specbench.speculation.cost import CostCurve
from specbench.speculation.batch_policy import (BatchCost, BatchGoodput, FixedSpeculation, best_row_budget, measure_batch_cost, node_cells)
from specbench.registry import build_drafter


def flat_cost(per_row: float = 0.0, base: float = 1.0, batches=(1, 16), rows=(1, 64)) -> BatchCost:
    """t(B, R) = base + per_row * B * R at the measured points (linear in between)."""
    return BatchCost(batches=list(batches), rows=list(rows),
                     times=[[base + per_row * b * r for r in rows] for b in batches])


def test_the_cost_interpolates_in_rows_and_batches():
    cost = BatchCost(batches=[1, 4], rows=[1, 9], times=[[1.0, 2.0], [2.0, 6.0]])
    assert cost.t(1, 5) == 1.5 and cost.t(4, 1) == 2.0
    assert abs(cost.t(2, 5) - (1.5 + (4.0 - 1.5) / 3)) < 1e-12
    assert cost.t(1, 17) == 3.0  # past the last point: the last segment's slope
    # a second context length: linear in L between the two and beyond, the short one's time below it
    cost = BatchCost(batches=[1], rows=[1, 9], times=[[1.0, 2.0]], context_len=256,
                     long_context_len=1024, long_times=[[3.0, 6.0]])
    assert cost.t(1, 1) == cost.t(1, 1, 100) == 1.0 and cost.t(1, 9, 1024) == 6.0
    assert cost.t(1, 1, 640) == 2.0 and cost.t(1, 1, 1792) == 5.0


def test_every_row_budget_at_once_is_the_budget_of_each_alone():
    """t_rows (B and L interpolated once) is t row by row; best_row_budget, which grows the expected
    tokens one row at a time, is the argmax of the formula computed afresh for every R."""
    import random

    rng = random.Random(0)
    cost = BatchCost(batches=[1, 2, 4, 8, 16], rows=[1, 2, 4, 8, 16, 32, 64],
                     times=[[0.1 + 0.002 * b * r + 0.01 * rng.random() for r in (1, 2, 4, 8, 16, 32, 64)]
                            for b in (1, 2, 4, 8, 16)], context_len=256, long_context_len=1024,
                     long_times=[[0.15 + 0.003 * b * r for r in (1, 2, 4, 8, 16, 32, 64)] for b in (1, 2, 4, 8, 16)])
    for batch, context in ((3, None), (12, 700), (16, 2000), (20, 100)):
        each = [cost.t(batch, r, context) for r in range(1, 81)]
        assert cost.t_rows(batch, range(1, 81), context) == pytest.approx(each, rel=1e-12)
    for _ in range(50):
        # uneven drafts: some requests have none, some fewer nodes than the budget
        sorted_p = [sorted((rng.random() for _ in range(rng.choice([0, 3, 20, 80]))), reverse=True)
                    for _ in range(rng.randint(1, 16))]
        host, plain = rng.uniform(-0.01, 0.05), rng.uniform(-0.01, 0.02)
        def rate(r):
            t = cost.t(len(sorted_p), r, 600)
            step = max(0.1 * t, t + (plain if r == 1 else host))
            return (1.05 if r == 1 else 1.0) * sum(1 + sum(p[: r - 1]) for p in sorted_p) / step
        brute = max(range(1, 65), key=lambda r: (rate(r), -r))
        assert best_row_budget(sorted_p, cost, 64, host, 600, plain, 0.05) == brute


def test_the_budget_speculates_where_rows_are_cheap_and_not_where_they_are_dear():
    likely = [[0.9, 0.8, 0.7, 0.5]] * 4
    assert best_row_budget(likely, flat_cost(0.0), 16) == 5  # free rows: every useful node
    assert best_row_budget(likely, flat_cost(1.0, base=0.0), 16) == 1  # each row costs a plain step: none
    # one request's hopeless drafts do not drag the others down, nor pull them up
    assert best_row_budget([[0.0] * 4, [0.0] * 4], flat_cost(0.0), 16) == 1


def test_host_work_beyond_the_forward_makes_wider_steps_pay():
    # each row costs twice the forward's fixed part: 3 nodes at p = 0.5 do not pay for themselves ...
    cost = flat_cost(1.0, base=0.5)
    likely = [[0.5, 0.5, 0.5]]
    assert best_row_budget(likely, cost, 4) == 1
    # ... until each step also spends as long again outside the forward (drafting, verifying)
    assert best_row_budget(likely, cost, 4, host_s=3.0) == 4
    policy = BatchGoodput(cost)
    for _ in range(100):  # steps measured at 2 s beyond the forward's t(1, 1) = 1.5 s
        policy.observe_step(1, 1, cost.t(1, 1) + 2.0)
    assert abs(policy.host_s - 2.0) < 1e-3


def test_steps_faster_than_the_curve_are_learned_so_cheap_plain_steps_are_not_undersold():
    # the curve says a second row is almost free (1.0 s vs 1.05 s), so a node at p = 0.1 pays ...
    cost = BatchCost(batches=[1, 16], rows=[1, 2, 64], times=[[1.0, 1.05, 4.0]] * 2)
    unlikely = [[0.1]]
    assert best_row_budget(unlikely, cost, 2) == 2
    # ... but this run's plain steps take 0.9 s and its tree steps what the curve says: 1.1 tokens in 1.05 s
    # lose to 1 in 0.9 s. A residual floored at 0 would keep plain steps at 1.0 s and speculate.
    policy = BatchGoodput(cost)
    policy.drafted = False
    for _ in range(20):
        policy.observe_step(1, 1, 0.9)
    policy.drafted = True
    for _ in range(20):
        policy.observe_step(1, 2, 1.05)
    assert policy.plain_host_s == pytest.approx(-0.1) and abs(policy.host_s) < 0.01
    assert best_row_budget(unlikely, cost, 2, policy.host_s, None, policy.plain_host_s) == 1
    # however fast a step was, no step is costed below a tenth of its forward
    assert best_row_budget([[0.5]], cost, 2, host_s=-5.0, plain_host_s=-5.0) == 2


def test_speculation_must_also_pay_for_the_drafting_that_plain_steps_skip():
    cost = flat_cost(1.0, base=0.5)
    likely = [[0.9, 0.9, 0.9]]
    assert best_row_budget(likely, cost, 4, host_s=1.0) == 4  # drafting costs what a plain step does too
    # drafting costs 5 s more than a plain step: 3.7 tokens in 10.5 s lose to 1 token in 2.5 s
    assert best_row_budget(likely, cost, 4, host_s=6.0, plain_host_s=1.0) == 1
    # a margin: 3.7 tokens in 5.5 s beat 1 in 2.5 s by 68%, not by the 70% asked
    assert best_row_budget(likely, cost, 4, host_s=1.0, min_gain=0.7) == 1
    assert best_row_budget(likely, cost, 4, host_s=1.0, min_gain=0.6) == 4
    policy = BatchGoodput(cost, host_half_life=1.0)
    policy.observe_step(1, 4, cost.t(1, 4) + 3.0)  # a tree step
    policy.drafted = False
    policy.observe_step(1, 1, cost.t(1, 1) + 0.25)  # a plain step's host work is kept apart from drafting's
    # the tree step, aged one half-life, against a prior of one fresh sample (the plain step: no probe yet)
    assert policy.plain_host_s == 0.25 and policy.host_s == pytest.approx((3.0 / 2 + 0.25) / (1 / 2 + 1))


def test_one_slow_tree_step_fades_and_steady_ones_are_learned():
    cost = flat_cost(1.0, base=0.5)
    likely = [[0.9, 0.9, 0.9]]
    policy = BatchGoodput(cost, host_half_life=8.0)
    policy.observe_step(1, 1, cost.t(1, 1) + 0.5)  # a probe: drafted, verified nothing
    assert policy.host_s == policy.plain_host_s == 0.5  # until there was a tree step, its figure
    policy.observe_step(1, 8, cost.t(1, 8) + 4.0)  # one slow tree step (a cold shape) counts ...
    assert policy.host_s == pytest.approx((4.0 + 0.5) / 2)
    policy.drafted = False
    policy.observe_step(1, 1, cost.t(1, 1) + 0.1)
    # ... and keeps 3 likely nodes out: 3.7 tokens in 4.5 s + h_draft lose to 1 in 1.5 s + 0.1 s
    assert best_row_budget(likely, cost, 4, policy.host_s, None, policy.plain_host_s) == 1
    for _ in range(32):  # four half-lives of plain steps: it fades towards the probes' figure
        policy.observe_step(1, 1, cost.t(1, 1) + 0.1)
    assert policy.host_s < 0.75
    assert best_row_budget(likely, cost, 4, policy.host_s, None, policy.plain_host_s) == 4
    policy.drafted = True
    for _ in range(64):  # tree steps that are all that slow: their figure is learned
        policy.observe_step(1, 8, cost.t(1, 8) + 4.0)
    assert 3.6 < policy.host_s <= 4.0  # (4 W + 0.5) / (W + 1), W ~ 12 samples' weight at this half-life


def test_each_request_keeps_its_most_likely_nodes_as_a_subtree():
    policy = BatchGoodput(flat_cost(0.0))
    tree = DraftTree([0, 0, 1, 3])  # 1, 2 under the root; 3 under 1; 4 under 3
    draft = Draft(tokens=torch.tensor([11, 12, 13, 14]), tree=tree)
    for _ in range(60):  # the top child and its chain are always accepted, the second child never
        policy.observe("a", draft, [1, 3, 4])
    p_first, p_second = policy._table("a").rates()[node_cells(tree)[0]], policy._table("a").rates()[node_cells(tree)[1]]
    assert p_first > 0.9 and p_second < 0.2
    policy.cost = BatchCost(batches=[1, 16], rows=[1, 4, 5], times=[[1.0, 1.0, 10.0]] * 2)  # a 5th row is dear
    (chosen,) = policy.choose([draft], ["a"])
    assert chosen.tokens.tolist() == [11, 13, 14] and list(chosen.tree.parents) == [0, 1, 2]
    policy.cost = flat_cost(1.0, base=0.0)
    assert policy.choose([draft], ["a"]) == [None]  # rows as dear as steps: plain decoding
    assert FixedSpeculation().choose([draft], ["a"]) == [draft]


def test_a_drafters_own_node_probabilities_rank_its_nodes():
    """tr_fused's confidences (or EAGLE-2's path scores) beat the policy's generic (depth, rank) rates:
    the second child the drafter is sure of is kept over the first child's chain it doubts."""
    tree = DraftTree([0, 0, 1])  # 1, 2 under the root; 3 under 1
    policy = BatchGoodput(BatchCost(batches=[1, 16], rows=[1, 2, 3], times=[[1.0, 1.0, 10.0]] * 2))
    generic = Draft(tokens=torch.tensor([11, 12, 13]), tree=tree)
    (cut,) = policy.choose([generic], ["a"])
    assert cut.tokens.tolist() == [11]  # by rates alone the top child wins
    sure = Draft(tokens=torch.tensor([11, 12, 13]), tree=tree, node_probs=[0.1, 0.9, 0.8])
    (cut,) = policy.choose([sure], ["a"])
    assert cut.tokens.tolist() == [12] and list(cut.tree.parents) == [0]
    # a child's estimate above its parent's is capped by it: node 3 is never kept before node 1
    (cut,) = policy.choose([Draft(tokens=torch.tensor([11, 12, 13]), tree=tree, node_probs=[0.3, 0.2, 0.95])], ["a"])
    assert cut.tokens.tolist() == [11]
    # the drafter's scale is checked against outcomes: when its sure nodes (q in 0.9-1) keep failing and
    # its doubtful one keeps being accepted, the batch's rates rank them the other way round
    for _ in range(40):
        policy.observe("a", sure, [1])
    (cut,) = policy.choose([sure], ["a"])
    assert cut.tokens.tolist() == [11]


def test_tr_fused_hands_its_confidences_to_the_policy(tiny_llama):
    vocab = tiny_llama.get_output_embeddings().weight.shape[0]
    d = build_drafter("tr_fused", vocab_size=vocab, hardware_curve=CostCurve(widths=[1, 128], times=[1.0, 1.0]))
    seq = [5, 6, 7, 8, 9] * 6 + [5, 6]
    Engine(tiny_llama, []).generate(seq, d, 12)
    draft = d.propose(DecodeState(tokens=torch.tensor(seq), prompt_len=len(seq), step=1))
    assert draft is not None and len(draft.node_probs) == len(draft.tree)
    assert all(0.0 <= p <= 1.0 for p in draft.node_probs)
    # the retrieved chain 7, 8, 9, 5, ... hangs under the root, each token less sure than its parent
    tokens, parents, chain, node = draft.tokens.tolist(), draft.tree.parents, [], 0
    for want in (7, 8, 9, 5):
        node = next(v for v in range(1, len(tokens) + 1) if parents[v - 1] == node and tokens[v - 1] == want)
        chain.append(draft.node_probs[node - 1])
    assert chain == sorted(chain, reverse=True) and chain[-1] < chain[0]


def test_goodput_in_the_batched_engine_keeps_every_output(tiny_llama):
    """Cutting drafts never changes a token: each request equals its single-request AR output."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (6, 14, 9)]
    refs = [Engine(tiny_llama, []).generate(p, build_drafter("ar"), 24).tokens for p in prompts]
    cost = BatchCost(batches=[1, 4], rows=[1, 8, 16], times=[[1.0, 1.1, 3.0], [1.0, 1.2, 4.0]])
    policy = BatchGoodput(cost)
    requests = [Request(p, 24, lambda: build_drafter("tr", vocab_size=97)) for p in prompts]
    out = BatchedEngine(tiny_llama, []).generate(requests, 2, policy)
    assert [r.tokens for r in out.records] == refs
    assert max(s.rows for s in out.steps) <= 2 * 9  # never past the budget the cost curve allows
    assert policy.rates == {} and policy.unverified == {}  # finished requests' estimates are dropped


def test_drafts_it_does_not_verify_are_learned_from_once_their_tokens_are_decided():
    """A cut draft teaches the policy what verifying it would have: once the tokens after its root are
    decided (a mismatch, or the path reaches a leaf), its would-be accepted path counts as if verified.
    Else a policy whose estimates fell would never see the drafts that would have paid again."""
    tree = DraftTree([0, 1, 0])  # a chain 1 -> 2 under the root, and a second child 3
    draft = Draft(tokens=torch.tensor([5, 6, 9]), tree=tree)
    dear = flat_cost(1.0, base=0.0)  # every row as dear as a step: nothing is verified
    cut, verified = BatchGoodput(dear), BatchGoodput(dear)
    assert cut.choose([draft], ["a"]) == [None]
    cut.observe("a", None, [], [5])  # node 1 right; node 2 not decided yet
    assert cut._table("a").rates() == verified._table("a").rates()
    cut.observe("a", None, [], [6])  # node 2 right too, and it is a leaf: the path is final
    verified.observe("a", draft, [1, 2], [5, 6])
    assert cut._table("a").rates() == verified._table("a").rates() != BatchGoodput(dear)._table("a").rates()
    assert cut.unverified["a"] == []
    # a mismatch decides at once; a drafter's own estimates are calibrated the same way
    sure = Draft(tokens=torch.tensor([5, 6, 9]), tree=tree, node_probs=[0.9, 0.85, 0.05])
    cut, verified = BatchGoodput(dear), BatchGoodput(dear)
    assert cut.choose([sure], ["b"]) == [None]
    cut.observe("b", None, [], [4])
    verified.observe("b", sure, [], [4])
    assert cut.calibration.rates() == verified.calibration.rates() != BatchGoodput(dear).calibration.rates()
    cut.choose([draft], ["c"])
    cut.forget("c")  # a finished request's pending drafts go with it
    assert "c" not in cut.unverified


def test_when_no_speculation_pays_the_drafters_are_not_asked(tiny_llama):
    """Plain decoding chosen: the next 1, 2, 4, ... (at most max_skip) steps skip drafting altogether."""
    policy = BatchGoodput(flat_cost(1.0, base=0.0), max_skip=4)  # every row as dear as a step
    tree = DraftTree([0, 1])
    draft = Draft(tokens=torch.tensor([5, 6]), tree=tree)
    asked = []
    for _ in range(20):
        asked.append(policy.wants_drafts())
        if asked[-1]:
            assert policy.choose([draft], ["a"]) == [None]
    # drafts at steps 0, 2, 5, 10, 15: skipping 1, 2, 4, 4 steps between
    assert [i for i, a in enumerate(asked) if a] == [0, 2, 5, 10, 15]
    policy.cost = flat_cost(0.0)  # rows free again: speculation pays, so every step drafts
    while not policy.wants_drafts():
        pass
    policy.observe("a", draft, [1, 2])
    assert policy.choose([draft], ["a"])[0] is not None
    assert all(policy.wants_drafts() for _ in range(5))

    class Counting:  # a drafter that counts its proposals
        calls = 0

    def make():
        d = build_drafter("pld")
        inner = d.propose

        def propose(state):
            Counting.calls += 1
            return inner(state)

        d.propose = propose
        return d

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 9, (n,), generator=g).tolist() * 3 for n in (5, 7)]  # repeats: PLD drafts
    refs = [Engine(tiny_llama, []).generate(p, build_drafter("ar"), 30).tokens for p in prompts]
    out = BatchedEngine(tiny_llama, []).generate([Request(p, 30, make) for p in prompts], 2,
                                                 BatchGoodput(flat_cost(1.0, base=0.0)))
    assert [r.tokens for r in out.records] == refs
    steps = sum(r.decoding_steps for r in out.records)
    assert Counting.calls < steps / 3  # drafting skipped on most steps


def test_the_batch_cost_is_measured_on_the_batched_forward(tiny_llama, tmp_path):
    cost = measure_batch_cost(tiny_llama, batches=(1, 2), rows=(1, 4), context_len=16, repeats=1, long_context_len=48)
    for table in (cost.times, cost.long_times):
        assert len(table) == 2 and all(len(t) == 2 and min(t) > 0 for t in table)
    assert BatchCost.load(cost.save(tmp_path / "cost.json")) == cost


def test_tr_requests_in_a_batch_learn_into_one_matrix(tiny_llama):
    """TR's matrix spans requests (share_learned_state); each request's output is still its AR output."""
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (7, 11, 5)]
    refs = [Engine(tiny_llama, []).generate(p, build_drafter("ar"), 20).tokens for p in prompts]
    made = []

    def make():
        d = build_drafter("tr_adaptive", vocab_size=97, confidence=True,
                          hardware_curve=CostCurve(widths=[1, 128], times=[1.0, 1.0]))
        if made:
            d.share_learned_state(made[0])
        made.append(d)
        return d

    out = BatchedEngine(tiny_llama, []).generate([Request(p, 20, make) for p in prompts], 3)
    assert [r.tokens for r in out.records] == refs
    assert all(d.matrix is made[0].matrix and d.probs is made[0].probs for d in made)
    assert bool(made[0].written.any())

"""Goodput-aware Token Recycling: the chooser's math on synthetic curves and statistics, the
drafter's bookkeeping, and losslessness on the real model with curves that do and do not draft."""

import json

import pytest
import torch

from specbench.methods.tr.adaptive import AdaptiveTokenRecycling
from specbench.methods.tr.base import TokenRecycling
from specbench.speculation.cost import CostCurve
from specbench.draft import DecodeState, StepOutcome
from specbench.speculation.goodput import (AcceptanceStats, PooledRateTable, RateTable, best_size, choose_nodes, counterfactual_path, monotone_down, path_probabilities, prior_probabilities, subtree_parents)
from specbench.draft import DraftTree

T1 = 0.064


def linear_curve(n: int) -> list[float]:
    """Every row costs as much as a plain step: drafting never pays."""
    return [T1 * w for w in range(1, n + 1)]


def flat_curve(n: int) -> list[float]:
    """Rows are free: the whole tree pays."""
    return [T1] * n


def curve(times_by_width: dict[int, float]) -> CostCurve:
    return CostCurve(widths=list(times_by_width), times=list(times_by_width.values()))


# ---- the chooser ------------------------------------------------------------------------------

TREE = DraftTree((0, 0, 1, 1, 2))  # root -> 1, 2; 1 -> 3, 4; 2 -> 5
P = [0.6, 0.3, 0.4, 0.1, 0.2]


def test_plain_step_when_drafting_never_pays():
    assert choose_nodes(P, TREE.parents, linear_curve(6)) == ()
    assert choose_nodes([1.0] * 5, TREE.parents, linear_curve(6), min_gain=0.01) == ()


def test_whole_tree_when_rows_are_free():
    assert choose_nodes(P, TREE.parents, flat_curve(6)) == (1, 2, 3, 4, 5)


def test_mid_case_by_hand():
    # sorted p: 0.6 (1), 0.4 (3), 0.3 (2), 0.2 (5), 0.1 (4); t(w) for w = 1..6:
    t = [1.0, 1.2, 1.3, 2.0, 2.1, 2.2]
    # m=0: 1/1 = 1; m=1: 1.6/1.2 = 1.33; m=2: 2.0/1.3 = 1.54; m=3: 2.3/2.0 = 1.15; m=4: 2.5/2.1; m=5: 2.6/2.2
    assert best_size([0.6, 0.4, 0.3, 0.2, 0.1], t) == 2
    assert choose_nodes(P, TREE.parents, t) == (1, 3)


def test_non_monotone_curve_prefers_the_cheaper_wider_forward():
    # as on this CPU's BLAS: 2 and 3 rows cost more than 4
    t = [1.0, 1.9, 1.9, 1.5, 1.6, 1.7]
    # 3 nodes: 2.3 / 1.5 = 1.53 beats 1 / 1, 1.6 / 1.9, 2.0 / 1.9, 2.35 / 1.6 and 2.36 / 1.7
    assert best_size([0.6, 0.4, 0.3, 0.05, 0.01], t) == 3


def test_min_gain_refuses_a_marginal_draft():
    t = [1.0, 1.5]
    assert best_size([0.55], t) == 1  # 1.55 / 1.5 = 1.033
    assert best_size([0.55], t, min_gain=0.05) == 0


def test_monotone_down_caps_children_and_keeps_the_set_parent_closed():
    p = [0.2, 0.1, 0.5, 0.05, 0.3]  # node 3 (child of 1) and node 5 (child of 2) above their parents
    assert monotone_down(p, TREE.parents) == [0.2, 0.1, 0.2, 0.05, 0.1]
    for t in ([1.0, 1.05, 1.1, 1.12, 1.13, 1.14], flat_curve(6)):
        nodes = choose_nodes(p, TREE.parents, t)
        assert all(TREE.parents[v - 1] in (0, *nodes) for v in nodes)


def test_subtree_parents_renumbers_and_refuses_orphans():
    assert subtree_parents((1, 3), TREE.parents) == (0, 1)
    assert subtree_parents((1, 2, 4, 5), TREE.parents) == (0, 0, 1, 2)
    with pytest.raises(ValueError, match="parent-closed"):
        subtree_parents((3,), TREE.parents)


def test_counterfactual_path_follows_the_verifier():
    tokens = [9, 10, 11, 12, 13, 14]  # root 9; node v has token 9 + v
    assert counterfactual_path(TREE.children, tokens, [11, 14, 99]) == [2, 5]
    assert counterfactual_path(TREE.children, tokens, [10, 13]) == [1, 4]
    assert counterfactual_path(TREE.children, tokens, [42]) == []
    assert counterfactual_path(TREE.children, tokens, []) == []
    dup = [9, 10, 10, 12, 13, 14]  # siblings 1 and 2 share a token: the first one wins
    assert counterfactual_path(TREE.children, dup, [10, 14]) == [1]


def test_prior_decays_with_depth_and_rank():
    assert prior_probabilities([1, 1, 2], [0, 1, 0], 0.5) == [0.5, 0.25, 0.25]


def test_stats_move_from_the_prior_to_the_observed_rates():
    stats = AcceptanceStats([0.5, 0.25], prior_steps=4, half_life=1e9)
    assert stats.probabilities() == pytest.approx([0.5, 0.25])
    for i in range(400):
        stats.add([1] if i % 4 else [1, 2])  # node 1 always, node 2 one step in four
    assert stats.probabilities() == pytest.approx([1.0, 0.25], abs=0.01)
    assert stats.version[0] == 400


def test_stats_forget_with_their_half_life_and_keep_buckets_apart():
    stats = AcceptanceStats([0.0], prior_steps=0, half_life=10, buckets=2)
    for _ in range(10):
        stats.add([1])
    for _ in range(10):
        stats.add([])
    # the ten hits are ten steps old: they weigh half as much as the ten misses
    hits = sum(0.5 ** (k / 10) for k in range(10, 20))
    misses = sum(0.5 ** (k / 10) for k in range(10))
    assert stats.probabilities()[0] == pytest.approx(hits / (hits + misses))
    assert stats.probabilities(1) == [0.0]  # bucket 1 saw nothing: its prior


def test_stats_survive_renormalisation():
    stats = AcceptanceStats([0.3], prior_steps=2, half_life=1)
    for i in range(1000):  # the weight doubles each step, so it is renormalised several times
        stats.add([1] if i % 2 else [])
    p = stats.probabilities()[0]
    assert 0.3 < p < 0.8 and stats.weight[0] < 1e100


# ---- the drafter ------------------------------------------------------------------------------

def adaptive(step_times: list[float], **kw) -> AdaptiveTokenRecycling:
    c = CostCurve(widths=list(range(1, len(step_times) + 1)), times=step_times)
    return AdaptiveTokenRecycling(vocab_size=10, k=2, tree=[[2], [2, 1]], cost_curve=c, **kw)


def feed(drafter, sequence: list[int], prompt_len: int = 1):
    """propose at every position of a sequence as if each step decided exactly one token."""
    drafts = []
    for n in range(prompt_len, len(sequence) + 1):
        drafts.append(drafter.propose(DecodeState(tokens=torch.tensor(sequence[:n]), prompt_len=prompt_len,
                                                  step=n - prompt_len)))
    return drafts


def cyclic(d: AdaptiveTokenRecycling) -> AdaptiveTokenRecycling:
    """Matrix rows for the text 1 2 3 1 2 3 ...: rank 0 always right, rank 1 never."""
    d.matrix[1] = torch.tensor([2, 5], dtype=torch.int32)
    d.matrix[2] = torch.tensor([3, 6], dtype=torch.int32)
    d.matrix[3] = torch.tensor([1, 7], dtype=torch.int32)
    if d.chooser.confidence:  # the model was fairly sure of its rank-0 guesses
        d.probs[1:4] = torch.tensor([0.75, 0.25])
    return d


@pytest.mark.parametrize("confidence", [True, False])
def test_adaptive_learns_a_predictable_chain_and_drafts_it(confidence):
    d = cyclic(adaptive([1.0, 1.02, 1.04, 1.06, 1.08, 1.1], confidence=confidence, prior_steps=1,
                        half_life=1000, context_buckets=False))
    drafts = feed(d, [1, 2, 3] * 20)
    last = drafts[-1]
    assert last is not None
    # the rank-0 chain (template nodes 1 and 3) is always right; the rank-1 nodes never are
    assert last.tree.parents == (0, 1) and last.tokens.tolist() == [1, 2]  # root 3 -> 1 -> 2
    assert d.chooser.drafted_steps > 0


@pytest.mark.parametrize("confidence", [True, False])
def test_adaptive_never_drafts_when_rows_cost_a_step_each(confidence):
    d = cyclic(adaptive(linear_curve(6), confidence=confidence))
    assert all(x is None for x in feed(d, [1, 2, 3] * 20))
    # it still learned that rank 0 is right after a rank-0 hit (bucket 1)
    if confidence:
        assert d.chooser.rates.rates()[d.chooser._cell(0.75, 1, bucket=1)] > 0.9
        assert d.chooser.rates.rates()[d.chooser._cell(0.25, 2, bucket=1)] < 0.1
    else:
        assert d.chooser.stats.probabilities(1)[0] > 0.9


def test_adaptive_drafts_everything_when_rows_are_free():
    d = adaptive(flat_curve(6), confidence=False)  # slot statistics: the prior alone pays
    assert feed(d, [4])[0].tree.parents == (0, 0, 1, 1, 2)
    d = adaptive(flat_curve(6), confidence=True)
    assert feed(d, [4])[0] is None  # nothing recycled yet: no confidence in any node
    d.probs[:] = 0.95  # a matrix the model was sure of
    assert feed(d, [4])[0].tree.parents == (0, 0, 1, 1, 2)


def test_confidence_is_the_models_probability_of_each_recycled_token():
    d = adaptive(flat_curve(6), confidence=True)
    draft = feed(d, [4])[0]
    assert draft is None
    logits = torch.full((1, 10), -1e4)
    logits[0, [7, 8]] = torch.tensor([1.0, 0.0])
    d.observe(StepOutcome(draft=None, root=4, logits=logits, accepted=[], bonus=7))
    assert d.matrix[4].tolist() == [7, 8]
    e = torch.e
    assert d.probs[4].tolist() == pytest.approx([e / (e + 1), 1 / (e + 1)])
    assert d.chooser.confidence and not adaptive(flat_curve(6), device="meta").chooser.confidence


def test_path_probabilities_and_rate_table():
    assert path_probabilities(TREE.parents, [0.5, 0.2, 0.5, 0.1, 1.0]) == pytest.approx([0.5, 0.2, 0.25, 0.05, 0.2])
    rates = RateTable([0.5, 0.1], prior_steps=2, half_life=1e9)
    assert rates.rates() == pytest.approx([0.5, 0.1])
    for i in range(100):
        rates.add(0, i % 4 == 0)
        rates.next_step()
    assert rates.rates()[0] == pytest.approx((25 + 1) / 102, rel=1e-3) and rates.rates()[1] == pytest.approx(0.1)


@pytest.mark.parametrize("pooled", [False, True])
def test_one_cells_rate_is_the_tables_double(pooled):
    """`rate(cell)` makes one cell's q as `rate_array` makes every cell's: the same double, pooled or not,
    with and without a prior, before and after the table's own cache is made."""
    import numpy as np

    rng = np.random.default_rng(0)
    for prior_steps in (4.0, 0.0):
        prior = rng.uniform(0.05, 0.95, 12).tolist()
        table = (PooledRateTable(prior, pools=[c % 3 for c in range(12)], prior_steps=prior_steps, half_life=50)
                 if pooled else RateTable(prior, prior_steps=prior_steps, half_life=50))
        for step in range(40):
            for cell in rng.integers(0, 10, 5):  # cells 10 and 11 never tried
                table.add(int(cell), bool(rng.random() < 0.4))
            table.next_step()
            ours = [table.rate(c) for c in range(12)]
            assert ours == table.rate_array().tolist() == [table.rate(c) for c in range(12)]


def test_adaptive_needs_a_curve_and_refuses_tree_adaptive_for_tr():
    with pytest.raises(ValueError, match="cost curve"):
        AdaptiveTokenRecycling(vocab_size=10)
    with pytest.raises(ValueError, match="tr_adaptive"):
        TokenRecycling(vocab_size=10, tree="adaptive")


def test_curve_from_a_file(tmp_path):
    path = curve({1: 0.05, 8: 0.06, 81: 0.5}).save(tmp_path / "c.json")
    d = AdaptiveTokenRecycling(vocab_size=10, cost_curve=str(path))
    assert d.chooser.step_times[0] == pytest.approx(0.05) and len(d.chooser.step_times) == 81


# ---- lossless on the real model ----------------------------------------------------------------


def test_run_with_adaptive_tr_reports_rows_and_bound(real_model, tmp_path, capsys):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench.main import run_benchmark
    from tests.test_config import CONF

    curve_file = curve({1: T1, 2: 0.070, 81: 0.3}).save(tmp_path / "curve.json")
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = OmegaConf.to_container(compose("config", overrides=[
            "method=tr_adaptive", "task.limit=1", "max_new_tokens=16", "warmup=0", f"cost_curve={curve_file}",
            f"results_dir={tmp_path / 'run'}", "progress=false", "wandb.enabled=false"]), resolve=True)
    summary = run_benchmark(cfg)
    assert summary["method"] == "tr_adaptive" and summary["lossless"]["mismatches"] == 0
    rec = json.loads((tmp_path / "run" / "answers.jsonl").read_text().splitlines()[0])
    turn = rec["turns"][0]
    assert len(turn["step_rows"]) == len(turn["accept_lengths"]) == turn["decoding_steps"]
    assert summary["speedup_bound"] > 0
    assert summary["speedup_bound_detail"]["cost_curve"]["t1_ms"] == pytest.approx(64.0)
    assert json.loads((tmp_path / "run" / "cost_curve.json").read_text())["times_ms"]["1"] == 64.0
    out = capsys.readouterr().out
    assert "| tr_adaptive " in out and "bound" in out


def test_a_pooled_cell_starts_from_its_pools_rate():
    """Cells 0 and 1 share pool 0; cell 2 is alone in pool 1. Trials of cell 0 move cell 1's rate,
    which has none of its own, towards what the pool has seen; cell 2 keeps its prior."""
    rates = PooledRateTable([0.9, 0.9, 0.5], pools=[0, 0, 1], prior_steps=2, half_life=1e9)
    for _ in range(20):
        rates.add(0, False)
        rates.next_step()
    q = rates.rates()
    assert q[1] == pytest.approx(rates.pool.rates()[0]) and q[1] < 0.2
    assert q[0] < q[1] and q[2] == pytest.approx(0.5)
    plain = RateTable([0.9, 0.9, 0.5], prior_steps=2, half_life=1e9)
    assert plain.rates()[1] == pytest.approx(0.9)


def test_coupled_expansion_ranks_first_the_token_the_target_samples():
    """With the recycled rows equal to this position's distributions, rank 0 of every expanded node
    is the target's own sample whenever that sample is among the row's k candidates; the other
    ranks are the row's remaining candidates, and the noise read per candidate is the row's."""
    import numpy as np
    from specbench.decoding.sampling import PositionSampler, gumbel_noise
    from specbench.drafting.recycling import coupled_expansion

    vocab, k = 300, 6
    torch.manual_seed(0)
    logits = torch.randn(vocab, vocab) * 3  # row t: the distribution after token t
    top = logits.topk(k, dim=-1)
    matrix = top.indices.to(torch.int32).numpy()
    probs = (top.values - torch.logsumexp(logits, -1, keepdim=True)).exp().numpy()
    tr = TokenRecycling(vocab_size=vocab, k=k, tree=[[3], [1, 1, 1], [1, 0, 0]])
    sampler = PositionSampler(0.7, seed=1)
    sampler.bind("q", 0)
    assert np.array_equal(sampler.noise_row(9, vocab), gumbel_noise(sampler.key, torch.tensor([9]), vocab)[0].numpy())
    inside = 0
    for position in range(120):
        root = (7 * position) % vocab
        noise = [sampler.noise_row(position + d, vocab) for d in range(len(tr.source.host_levels))]
        tokens, conf = coupled_expansion(matrix, probs, tr.source.host_levels, root, noise, 0.7)
        assert sorted(tokens[1:4].tolist()) == sorted(set(tokens[1:4].tolist()))  # three distinct candidates
        assert set(tokens[1:4].tolist()) <= set(matrix[root].tolist())
        assert conf.min() >= 0 and conf.max() <= 1
        for node, parent, at in ((1, root, position), (4, int(tokens[1]), position + 1)):
            sample = int(sampler(logits[parent : parent + 1], torch.tensor([at]))[0])
            if sample in matrix[parent]:
                inside += 1
                assert tokens[node] == sample
    assert inside > 150  # most samples lie in the top k: the check above ran


def test_coupled_drafts_only_when_sampling_on_the_host_and_stays_lossless():
    """`coupled` needs a sampler with T > 0 and confidences; the drafter's output equals AR's."""
    from specbench.decoding.engine import Engine
    from specbench.decoding.sampling import PositionSampler
    from specbench.methods.ar import Autoregressive
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=12, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=96)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4)
    flat = curve({w: 0.01 for w in range(1, 40)})
    sampler = PositionSampler(0.7, seed=5)
    greedy = AdaptiveTokenRecycling(vocab_size=12, model=model, hardware_curve=flat, k=4,
                                    tree=[[3], [2, 1, 1], [1, 1, 0, 0]])
    assert greedy.chooser.sampler is None  # no sampler: nothing to couple to
    coupled = AdaptiveTokenRecycling(vocab_size=12, model=model, hardware_curve=flat, sampler=sampler, k=4,
                                     tree=[[3], [2, 1, 1], [1, 1, 0, 0]])
    assert coupled.chooser.sampler is sampler
    off = AdaptiveTokenRecycling(vocab_size=12, model=model, hardware_curve=flat, sampler=sampler, k=4,
                                 tree=[[3], [2, 1, 1], [1, 1, 0, 0]], coupled=False)
    assert off.chooser.sampler is None
    engine = Engine(model, eos_token_ids=[])
    for qid in range(3):
        sampler.bind(qid, 0)
        ar = engine.generate([1, 2, 3, 4], Autoregressive(), 40, sampler)
        out = engine.generate([1, 2, 3, 4], coupled, 40, sampler)
        assert out.tokens == ar.tokens
        assert max(out.accept_lengths) > 1  # coupled drafts were accepted, not only plain steps


def test_a_steps_trials_at_once_count_as_one_by_one():
    """`add_many` (a step's trials at once, cells repeating) leaves the same doubles as `add` cell by cell,
    pooled or not, and the rates read as an array are the list's."""
    import numpy as np

    rng = np.random.default_rng(0)
    prior = list(rng.random(12))
    for make in (lambda: RateTable(prior, prior_steps=3, half_life=7),
                 lambda: PooledRateTable([0.9] * 6 + [0.2] * 6, pools=[c % 4 for c in range(12)], prior_steps=3,
                                         half_life=7)):
        one, many = make(), make()
        for _ in range(2400):  # past the renormalisation at weight 1e100 (half_life 7: step 2,326)
            cells, hits = rng.integers(0, 12, size=9), rng.random(9) < 0.4
            for c, h in zip(cells.tolist(), hits.tolist()):
                one.add(c, h)
            many.add_many(cells, hits)
            one.next_step()
            many.next_step()
        assert one.rates() == many.rates() and many.rate_array().tolist() == many.rates()


def test_choose_nodes_matches_a_running_argmax():
    """choose_nodes and best_size on arrays against the plain loop they replaced: ties by id and the
    smaller m, the margin strict."""
    import numpy as np

    def loop(p, parents, times, gain, max_nodes):
        q = monotone_down(p, parents)
        order = sorted(range(len(q)), key=q.__getitem__, reverse=True)[:max_nodes]
        best_m, best, expected = 0, (1 / times[0]) * (1 + gain), 1.0
        for m, i in enumerate(order, start=1):
            expected += q[i]
            if expected / times[m] > best:
                best_m, best = m, expected / times[m]
        return tuple(sorted(i + 1 for i in order[:best_m]))

    rng = np.random.default_rng(3)
    parents = TREE.parents
    for trial in range(300):
        p = rng.choice([0.0, 0.25, 0.5, 0.9], size=len(parents)).tolist()  # many ties
        times = np.cumsum(rng.random(len(parents) + 1) * 0.02 + 0.01).tolist()
        gain, max_nodes = rng.choice([0.0, 0.05]), rng.choice([None, 2, 4])
        assert choose_nodes(p, parents, times, gain, max_nodes) == loop(p, parents, times, gain, max_nodes)
    assert best_size([], [0.05]) == 0 and best_size([0.5], [0.05, 0.05]) == 1


@pytest.mark.parametrize("seed", range(40))
def test_the_choice_kernel_chooses_what_choose_nodes_chooses(packed_kernel, seed):
    """decoding/goodput_choice.cpp against speculation/goodput.py's `choose_nodes`: the same nodes on random
    trees, estimates (ties and zeros among them), curves, margins and caps."""
    import random

    rng = random.Random(seed)
    n = rng.randint(0, 90)
    parents = [rng.randint(0, i) for i in range(n)]  # node i + 1's parent precedes it
    levels = [0.0, 0.05, 0.2, 0.5, 0.5, 0.9]
    p = [rng.choice(levels) if rng.random() < 0.3 else rng.random() for _ in range(n)]
    t = sorted(rng.uniform(1.0, 3.0) for _ in range(n + 1)) if seed % 3 else [1.0 + 0.01 * w for w in range(n + 1)]
    gain = rng.choice([0.0, 0.02, 0.5])
    cap = rng.choice([None, 1, 3, 20])
    assert tuple(torch.ops.specbench.choose_nodes(p, parents, t, gain, cap)) == choose_nodes(p, parents, t, gain, cap)

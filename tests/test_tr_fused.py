"""tr_fused: merging a retrieval chain or tree into TR's template, the chain statistics, the suffix
source's drafts and frequency estimates, the sources of accepted tokens, exact tokens on a tiny random
model and, for each retrieval source, on a short real generation (all settings at defaults:
test_lossless_methods)."""

import numpy as np
import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.draft import DecodeState
from specbench.speculation.cost import CostCurve
from specbench.speculation.goodput import PooledRateTable
from specbench.methods.ar import Autoregressive
from specbench.methods.tr.fused import (MATRIX, SUFFIX_BINS, FusedTokenRecycling, merge_chain, merge_tree,
                                        retrieved_trials, suffix_cells)
from specbench.registry import build_drafter
from specbench.drafting import suffix_backends

TARGET = {"model_name": "smollm2-135m", "device": "cpu", "dtype_name": "float32"}
FLAT = CostCurve(widths=[1, 100], times=[1.0, 1.3], device="cpu", dtype="float32")
SUFFIX_BACKENDS = ["python", pytest.param("arctic", marks=pytest.mark.skipif(
    suffix_backends.arctic_problem() is not None, reason="arctic-inference does not import here"))]


def test_merge_chain_shares_the_longest_template_prefix():
    # template: root -> 1 (tok 7), 2 (tok 8); 1 -> 3 (tok 9)
    children = [[1, 2], [3], [], []]
    tokens = [0, 7, 8, 9]
    assert merge_chain(children, tokens, [7, 9, 4]) == ([1, 3], 2)  # 4 hangs below node 3
    assert merge_chain(children, tokens, [8, 9]) == ([2], 1)
    assert merge_chain(children, tokens, [5, 7]) == ([], 0)  # all of it below the root


def test_chain_hangs_below_the_shared_nodes_in_the_draft():
    d = FusedTokenRecycling(vocab_size=20, k=2, tree=[[2], [1, 0]], cost_curve=FLAT, confidence=False,
                            num_pred_tokens=2, retrieval="pld")
    d.matrix[4] = torch.tensor([6, 7], dtype=torch.int32)  # root 4 -> 6, 7; 6 -> (row empty) 0
    # context ... 4 6 3 ... 4: PLD continues the last "4" with "6 3"
    seq = torch.tensor([1, 4, 6, 3, 2, 4])
    draft = d.propose(DecodeState(tokens=seq, prompt_len=3, step=0))
    assert draft is not None
    paths = {tuple(draft.tokens[v - 1].item() for v in draft.tree.path_to(i + 1)) for i in range(len(draft.tree))}
    assert (6, 3) in paths  # the chain shares node "6" and adds "3" below it
    assert (6,) in paths and (7,) in paths


def test_chain_rates_learn_from_what_followed():
    d = FusedTokenRecycling(vocab_size=20, k=2, tree=[[1]], cost_curve=FLAT, confidence=False, num_pred_tokens=3)
    d.chooser._chains.append((0, [5, 6, 7], 2, 1))  # its first token is a template node too
    d.chooser._learn_chains(np.array([1, 5]))  # one token decided, still right: wait
    assert len(d.chooser._chains) == 1
    d.chooser._learn_chains(np.array([1, 5, 9]))  # second token wrong: depths 1 (hit) and 2 (miss)
    assert not d.chooser._chains
    # depth 1 counted among the tokens the template drafts too, depth 2 among those it does not
    assert d.chooser.chain_rates.trials[d.chooser._chain_cell(2, 1, agreed=True)] > 0
    assert d.chooser.chain_rates.trials[d.chooser._chain_cell(2, 1)] == 0
    assert d.chooser.chain_rates.trials[d.chooser._chain_cell(2, 2)] > 0 and d.chooser.chain_rates.hits[d.chooser._chain_cell(2, 2)] == 0
    assert d.chooser.chain_rates.trials[d.chooser._chain_cell(2, 3)] == 0


def test_template_nodes_the_chain_confirms_are_learnt_apart():
    """A matrix node that the chain also drafts is accepted more often than its confidence cell says
    over all nodes; tr_fused keeps the two apart (method.agreement), and the chain's tokens the same way."""
    d = FusedTokenRecycling(vocab_size=20, k=2, tree=[[2]], cost_curve=FLAT, confidence=True,
                            context_buckets=False, num_pred_tokens=3, pooled_prior=False)
    tokens = torch.tensor([3, 5, 6])  # root 3; node 1 (rank 0) drafts 5, node 2 (rank 1) drafts 6
    conf = torch.tensor([1.0, 0.55, 0.55])
    for _ in range(30):  # the chain drafts node 1's token, and node 1 is always right
        d.chooser.template._pending.append([0, tokens, conf, 0, frozenset({1}), None])
        d.chooser.template._learn(torch.tensor([3, 5]))
    rates = d.chooser.template.rates.rates()
    assert rates[d.chooser.template._cell(0.55, 1, 0, agreed=True)] > 0.9
    assert rates[d.chooser.template._cell(0.55, 1, 0)] == pytest.approx(0.55)  # never a trial: its prior
    plain = FusedTokenRecycling(vocab_size=20, k=2, tree=[[2]], cost_curve=FLAT, confidence=True,
                                context_buckets=False, num_pred_tokens=3, agreement=False)
    assert len(plain.chooser.template.rates.prior) * 2 == len(d.chooser.template.rates.prior)
    assert len(plain.chooser.chain_rates.prior) * 2 == len(d.chooser.chain_rates.prior)


@pytest.mark.parametrize("settings", [{}, {"matrix": False}, {"retrieval": False}, {"max_nodes": 2},
                                      {"retrieval": "suffix"}, {"retrieval": "suffix", "matrix": False},
                                      {"retrieval": "suffix", "suffix_tree": False},
                                      {"retrieval": "suffix", "suffix_global": True},
                                      {"retrieval": "suffix", "suffix_rates": True},
                                      {"agreement": False, "depth_cells": False, "pooled_prior": False},
                                      {"calibrate": True}],
                         ids=["both", "retrieval_only", "matrix_only", "budget_2", "suffix", "suffix_only",
                              "suffix_path", "suffix_global", "suffix_rates", "earlier_estimator", "calibrated"])
def test_exact_tokens_and_sources_on_a_tiny_model(tiny_llama, settings):
    engine = Engine(tiny_llama, eos_token_ids=[])
    prompt = [5, 17, 3, 17, 42, 8, 5, 17, 3, 9, 11, 5, 17]
    ar = engine.generate(prompt, Autoregressive(), 40)
    d = FusedTokenRecycling(vocab_size=97, cost_curve=FLAT, **settings)
    out = engine.generate(prompt, d, 40)
    assert out.tokens == ar.tokens
    s = d.take_statistics()
    accepted = sum(out.accept_lengths) - len(out.accept_lengths)
    counted = s["accepted_from_matrix"] + s["accepted_from_retrieval"] + s["accepted_from_both"]
    # the verifier's accepted nodes; the token budget may cut the last step's short
    assert accepted <= counted <= accepted + max(out.step_rows)
    if settings.get("matrix") is False:
        assert s["accepted_from_matrix"] == 0 and s["accepted_from_both"] == 0
    if settings.get("retrieval") is False:
        assert s["retrieval_steps"] == 0 and s["accepted_from_retrieval"] == 0 and s["retrieval_source"] == "none"
    else:
        assert s["retrieval_source"] == settings.get("retrieval", "pld") and s["retrieval_steps"] > 0
    assert max(out.step_rows) <= 1 + settings.get("max_nodes", 80)


def test_impossible_settings():
    with pytest.raises(ValueError, match="needs a source"):
        FusedTokenRecycling(vocab_size=20, cost_curve=FLAT, matrix=False, retrieval=False)
    with pytest.raises(ValueError, match="needs a source"):
        FusedTokenRecycling(vocab_size=20, cost_curve=FLAT, matrix=False, retrieval="none")
    with pytest.raises(ValueError, match="method.retrieval must be one of suffix, pld, none, got 'ngram'"):
        FusedTokenRecycling.check_settings({"retrieval": "ngram"}, TARGET)
    with pytest.raises(ValueError, match="suffix_depth must be at least 2"):
        FusedTokenRecycling.check_settings({"suffix_depth": 1}, TARGET)
    with pytest.raises(ValueError, match="suffix_min_prob in"):
        FusedTokenRecycling.check_settings({"suffix_min_prob": 2.0}, TARGET)
    with pytest.raises(ValueError, match="max_nodes must be at least 1"):
        FusedTokenRecycling(vocab_size=20, cost_curve=FLAT, max_nodes=0)
    with pytest.raises(ValueError, match="num_pred_tokens >= 1"):
        FusedTokenRecycling(vocab_size=20, cost_curve=FLAT, num_pred_tokens=0)


# -- the suffix source ------------------------------------------------------------------------------

def test_merge_tree_shares_template_paths_and_hangs_the_rest_below():
    # template: root -> 1 (tok 7), 2 (tok 8); 1 -> 3 (tok 9)
    children, tokens = [[1, 2], [3], [], []], [0, 7, 8, 9]
    # retrieved: 7 -> (9 -> 4), (5); 6 -> 7
    got = merge_tree(children, tokens, [7, 9, 5, 4, 6, 7], [-1, 0, 0, 1, -1, 4])
    assert got == [1, 3, None, None, None, None]
    # a chain is a tree: merge_chain's answer
    assert merge_tree(children, tokens, [7, 9, 4], [-1, 0, 1]) == [1, 3, None]


def drafted_paths(draft):
    return {tuple(draft.tokens[v - 1].item() for v in draft.tree.path_to(i + 1)): draft.node_probs[i]
            for i in range(len(draft.tree))}


@pytest.mark.parametrize("backend", SUFFIX_BACKENDS)
def test_suffix_source_drafts_the_repeated_continuation_with_frequency_estimates(backend):
    """A repetitive prompt: "1 2 3" occurs 4 times, the last at the end (continuing nowhere), followed
    by "4 5 0" twice and "4 6 0" once; the suffix tree drafts the repeated continuation, each node's
    estimate its frequency along the path (4: 3/4, 4 5: 2/4, 4 5 0: 2/4), not a learnt rate; the
    same from arctic-inference's trees. The next step's draft follows the tokens decided since."""
    d = FusedTokenRecycling(vocab_size=20, k=2, tree=[[1]], cost_curve=FLAT, confidence=False, matrix=False,
                            retrieval="suffix", suffix_min_prob=0.0, suffix_factor=2.0, suffix_tokens=3,
                            suffix_rates=False, suffix_backend=backend)
    seq = torch.tensor([1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 6, 0, 1, 2, 3])
    draft = d.propose(DecodeState(tokens=seq, prompt_len=len(seq) - 1, step=0))
    paths = drafted_paths(draft)
    assert paths == pytest.approx({(4,): 3 / 4, (4, 5): 2 / 4, (4, 5, 0): 2 / 4})
    # "4 6" decided: "3 4 6" occurred once, followed by "0 1 2"
    later = d.propose(DecodeState(tokens=torch.cat([seq, torch.tensor([4, 6])]), prompt_len=len(seq) - 1, step=1))
    assert max(drafted_paths(later), key=len) == (0, 1, 2)
    stats = d.take_statistics()
    assert stats["retrieval_steps"] == 2 and stats["suffix_backend"] == backend


def test_suffix_backend_is_checked_and_named_in_the_identity(monkeypatch):
    with pytest.raises(ValueError, match="method.suffix_backend must be one of auto, arctic, python, got 'gpu'"):
        FusedTokenRecycling.check_settings({"retrieval": "suffix", "suffix_backend": "gpu"}, TARGET)
    monkeypatch.setattr(suffix_backends, "arctic_problem", lambda: "No module named 'arctic_inference'")
    with pytest.raises(ValueError, match=r'method.suffix_backend=arctic needs arctic-inference.*pip install -e ".\[suffix\]"'):
        FusedTokenRecycling.check_settings({"retrieval": "suffix", "suffix_backend": "arctic"}, TARGET)
    assert FusedTokenRecycling.resource_identity({"retrieval": "suffix"}) == {"suffix_backend": "python"}
    assert FusedTokenRecycling.resource_identity({"retrieval": "pld"}) == {}


def test_suffix_cells_bin_each_node_given_its_parent_by_depth():
    # a root child at 0.75, its child at 0.5 of the path (2/3 given the parent), a sibling at 0.25
    assert suffix_cells([-1, 0, -1], [0.75, 0.5, 0.25]) == [7, SUFFIX_BINS + 6, 2]
    deep = suffix_cells([-1, 0, 1, 2], [1.0, 1.0, 1.0, 0.05])
    assert deep == [9, SUFFIX_BINS + 9, 2 * SUFFIX_BINS + 9, 2 * SUFFIX_BINS]  # depth 3 and below share a class


def test_retrieved_trials_count_the_children_of_the_decided_path():
    tokens, parents = [4, 5, 6, 7], [-1, 0, 0, 1]  # 4 -> (5 -> 7, 6)
    assert retrieved_trials(tokens, parents, [4]) is None  # 5 or 6 not yet known
    assert retrieved_trials(tokens, parents, [4, 6]) == [(0, True), (1, False), (2, True)]
    assert retrieved_trials(tokens, parents, [4, 5, 9]) == [(0, True), (1, True), (2, False), (3, False)]
    assert retrieved_trials(tokens, parents, [9]) == [(0, False)]  # the first token wrong: one trial


def test_suffix_rates_learn_what_the_frequency_estimates_promise():
    """A frequency estimate that keeps failing pulls its cell's rate down; the next draft's node
    estimate is the learnt rate, not the frequency."""
    d = FusedTokenRecycling(vocab_size=20, k=2, tree=[[1]], cost_curve=FLAT, confidence=False, matrix=False,
                            retrieval="suffix", suffix_min_prob=0.0, suffix_factor=2.0, suffix_tokens=1,
                            suffix_rates=True)
    seq = [1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 6, 0, 1, 2, 3]
    first = d.propose(DecodeState(tokens=torch.tensor(seq), prompt_len=20, step=0))
    assert drafted_paths(first) == pytest.approx({(4,): 0.75})  # the prior: the bin's middle
    cell = suffix_cells([-1], [0.75])[0]
    d.chooser._learn_retrieved(np.array(seq))  # nothing decided after the root yet
    assert len(d.chooser._retrieved) == 1 and d.chooser.suffix_rates.trials[cell] == 0
    d.chooser._learn_retrieved(np.array(seq + [9]))  # the model said 9, not 4
    assert not d.chooser._retrieved and d.chooser.suffix_rates.trials[cell] > 0 and d.chooser.suffix_rates.hits[cell] == 0
    for _ in range(12):
        d.chooser.suffix_rates.add(cell, False)
        d.chooser.suffix_rates.next_step()
    again = d.propose(DecodeState(tokens=torch.tensor(seq), prompt_len=20, step=1))
    learnt = d.chooser.suffix_rates.rates()[cell]
    assert learnt < 0.25 and drafted_paths(again) == pytest.approx({(4,): learnt})


@pytest.mark.parametrize("retrieval", ["suffix", "pld", "none"])
def test_each_retrieval_source_is_lossless_and_counts_its_accepted_tokens(retrieval, real_model, ar_tokens):
    """A short real generation on a prompt that repeats a passage: AR's tokens, and the per-source
    counts add up to the accepted tokens (the token budget may cut the last step's short)."""
    from specbench.inputs.chat import prompt_ids

    model, tok, eos = real_model
    text = "alpha, bravo, charlie, delta, echo, foxtrot, golf, hotel, india, juliett, kilo, lima."
    ids = prompt_ids(tok, [{"role": "user", "content": f"Repeat this list exactly, twice: {text}"}])
    d = build_drafter("tr_fused", vocab_size=model.get_output_embeddings().weight.shape[0], device="cpu",
                      model=model, model_name="smollm2-135m", dtype_name="float32", retrieval=retrieval,
                      hardware_curve=CostCurve(widths=[1, 128], times=[0.05, 0.05]))
    n = 32
    out = Engine(model, eos).generate(ids, d, n)
    assert out.tokens == ar_tokens(ids, n)
    s = d.take_statistics()
    accepted = sum(out.accept_lengths) - len(out.accept_lengths)
    counted = s["accepted_from_matrix"] + s["accepted_from_retrieval"] + s["accepted_from_both"]
    assert accepted <= counted <= accepted + max(out.step_rows)
    assert s["retrieval_source"] == retrieval
    if retrieval == "none":
        assert s["retrieval_steps"] == 0 and s["accepted_from_retrieval"] + s["accepted_from_both"] == 0
    else:
        assert s["retrieval_steps"] > 0
    if retrieval == "suffix":  # the passage is copied: the suffix tree's nodes are accepted
        assert s["accepted_from_retrieval"] + s["accepted_from_both"] > 0


def test_a_deeper_node_is_learnt_in_its_own_depth_cell():
    """method.depth_cells: a depth-2 node's trial counts in the depth-2 cell of its confidence, rank
    and bucket, not in the depth-1 one; with depth_cells=false both share one cell."""
    for depth_cells in (True, False):
        d = FusedTokenRecycling(vocab_size=20, k=1, tree=[[1], [1]], cost_curve=FLAT, confidence=True,
                                context_buckets=False, depth_cells=depth_cells, pooled_prior=False)
        tokens = torch.tensor([3, 5, 6])  # root 3 -> node 1 (5) -> node 2 (6), both rank 0
        conf = torch.tensor([1.0, 0.55, 0.55])
        d.chooser.template._pending.append([0, tokens, conf, 0, frozenset(), None])
        d.chooser.template._learn(torch.tensor([3, 5, 9]))  # node 1 right, node 2 wrong
        depth1, depth2 = d.chooser.template._cell(0.55, 1, 0), d.chooser.template._cell(0.55, 2, 0)
        assert (depth1 != depth2) == depth_cells
        if depth_cells:
            assert d.chooser.template.rates.hits[depth1] > 0 and d.chooser.template.rates.hits[depth2] == 0 and d.chooser.template.rates.trials[depth2] > 0


def test_calibration_scales_each_source_by_what_its_drafted_nodes_delivered(tiny_llama):
    """method.calibrate: accepted drafted nodes against their estimates, per source; a source scaled to
    nothing is no longer drafted, and the output stays AR's."""
    engine = Engine(tiny_llama, eos_token_ids=[])
    prompt = [5, 17, 3, 17, 42, 8, 5, 17, 3, 9, 11, 5, 17]
    ar = engine.generate(prompt, Autoregressive(), 40)
    d = FusedTokenRecycling(vocab_size=97, cost_curve=FLAT, calibrate=True)
    assert engine.generate(prompt, d, 40).tokens == ar.tokens
    assert sum(d.chooser.calibration.trials) > 0 and d.chooser.calibration.rates() != [1.0, 1.0, 1.0]

    muted = FusedTokenRecycling(vocab_size=97, cost_curve=FLAT, calibrate=True)
    muted.chooser.calibration.rate = lambda cell: (0.0, 1.0, 1.0)[cell]  # the matrix's own nodes never pay
    seen = []
    propose = muted.propose
    muted.propose = lambda state: (draft := propose(state), seen.extend(muted.chooser.sources))[0]
    assert engine.generate(prompt, muted, 40).tokens == ar.tokens
    assert seen and MATRIX not in seen  # only nodes the retrieval drafts (alone or with the matrix)


def test_every_nodes_cell_at_once_is_its_cell_one_by_one():
    """`_cells` (every template node at once, as the chooser reads and learns them) numbers each node as
    `_cell`, its one-node definition does: confidence bins (unwritten = 0 included), buckets, agreement."""
    import numpy as np

    d = FusedTokenRecycling(vocab_size=20, k=4, tree=[[3], [2, 1, 1], [1, 0, 1, 0]], cost_curve=FLAT,
                            confidence=True)
    t = d.chooser.template
    n = t.tree.size - 1
    conf = np.array([0.0, 0.05, 0.1, 0.55, 0.999, 1.0, 0.3, 0.7, 0.95], dtype=np.float32)
    assert len(conf) == n
    for bucket in (0, 1):
        for agreed in (frozenset(), frozenset({1, 4, n})):
            expected = [t._cell(float(conf[v - 1]), v, bucket, v in agreed) for v in range(1, n + 1)]
            assert t._cells(conf, bucket, agreed).tolist() == expected


@pytest.mark.parametrize("pooled", [True, False])
def test_the_learning_kernel_counts_what_numpy_counts(packed_kernel, pooled):
    """decoding/goodput_choice.cpp's `learn_counterfactual` against the chooser's numpy `_learn`: the same
    counterfactual paths (none, part of the template, its whole depth and past it) give the same trial and hit
    counts, to the last bit, in the cells and (pooled_prior) their pools."""
    import numpy as np

    from specbench.decoding.transfers import HostCopy

    rng = np.random.default_rng(1)
    gs = [FusedTokenRecycling(vocab_size=50, cost_curve=FLAT, pooled_prior=pooled).chooser.template for _ in range(2)]
    gs[1].host_kernels = False
    tree = gs[0].tree
    seq, at = [7], 0
    for step in range(60):
        tokens = torch.from_numpy(rng.integers(0, 6, tree.size))  # few tokens: siblings share some
        tokens[0] = seq[-1]
        conf = torch.from_numpy(rng.random(tree.size).astype(np.float32))
        agreed = frozenset(rng.choice(np.arange(1, tree.size), size=step % 3, replace=False).tolist())
        node, cont = 0, []
        for _ in range(rng.integers(0, tree.max_depth + 2)):  # down random children, then off the template
            kids = tree.children[node]
            if not kids:
                break
            node = kids[rng.integers(0, len(kids))]
            cont.append(int(tokens[node]))
        seq += cont + rng.integers(0, 6, tree.max_depth + 1 - len(cont)).tolist()
        for g in gs:
            g._pending.append([at, HostCopy(tokens), conf, step % 2, agreed, None if step % 4 == 0 else
                               g._cells(conf.numpy()[1:], step % 2, agreed)])
            g._learn(torch.tensor(seq))
        at = len(seq) - 1
    (a, b) = (g.rates for g in gs)
    assert not gs[0]._pending and a.weight == b.weight and a.trials.sum() > 0 and a.hits.sum() > 0
    assert np.array_equal(a.trials, b.trials) and np.array_equal(a.hits, b.hits)
    assert np.array_equal(a.rate_array(), b.rate_array())
    if pooled:
        assert np.array_equal(a.pool.trials, b.pool.trials) and np.array_equal(a.pool.hits, b.pool.hits)


def test_the_bucket_kernel_walks_the_template_as_python_does(packed_kernel):
    """decoding/goodput_choice.cpp's `template_bucket` against the chooser's Python `_bucket`: emitted tokens that
    leave the template at once, part way, at a rank-0 or a later child, at a leaf and past it, or none at all."""
    import numpy as np

    from specbench.decoding.transfers import HostCopy

    rng = np.random.default_rng(2)
    gs = [FusedTokenRecycling(vocab_size=50, cost_curve=FLAT).chooser.template for _ in range(2)]
    gs[1].host_kernels = False
    tree = gs[0].tree
    seen = {0: 0, 1: 0}
    for step in range(300):
        tokens = torch.from_numpy(rng.integers(0, 6, tree.size))  # few tokens: siblings share some
        node, cont = 0, []
        for _ in range(rng.integers(0, tree.max_depth + 2)):  # down random children, mostly rank 0
            kids = tree.children[node]
            if not kids:
                cont.append(int(rng.integers(0, 6)))  # past the template's depth
                break
            node = kids[0] if rng.random() < 0.6 else kids[rng.integers(0, len(kids))]
            cont.append(int(tokens[node]))
        if cont and rng.random() < 0.2:
            cont[-1] = 40 + int(rng.integers(0, 5))  # a token no child holds
        seq = torch.tensor([int(tokens[0]), *cont])
        got = []
        for g in gs:
            g._last = (0, HostCopy(tokens, True))
            got.append(g._bucket(seq))
        assert got[0] == got[1], (step, cont)
        seen[got[0]] += 1
    assert min(seen.values()) > 30


@pytest.mark.parametrize("pooled,prior_steps", [(True, None), (False, None), (True, 0.0), (False, 0.0)])
def test_the_estimate_kernel_gives_the_numpy_cells_and_estimates(packed_kernel, pooled, prior_steps):
    """decoding/goodput_choice.cpp's `template_probabilities` against the chooser's numpy: the same cells
    (confidence bins at their edges, unwritten entries, both buckets, agreed nodes) and the same doubles,
    the kernel making each cell's rate from the table's counts (pooled or not, with a prior or none, where a
    cell never tried keeps its base)."""
    import numpy as np

    g = FusedTokenRecycling(vocab_size=50, cost_curve=FLAT, pooled_prior=pooled,
                            prior_steps=prior_steps).chooser.template
    assert isinstance(g.rates, PooledRateTable) == pooled
    assert g.host_kernels and g.agreement_classes == 2
    rng = np.random.default_rng(0)
    n, cells = g.tree.size - 1, len(g.rates.prior)
    g.rates.add_many(rng.integers(0, cells, 400), rng.random(400) < 0.4)
    g.rates.next_step()
    edges = np.array([0.0, 0.1, 0.3, 0.7, 0.9999, 1.0, np.float32(0.2) * 1], dtype=np.float32)
    for trial in range(16):
        conf = np.where(rng.random(n + 1) < 0.5, rng.choice(edges, n + 1), rng.random(n + 1)).astype(np.float32)
        conf[0] = 1.0
        agreed = frozenset(rng.choice(np.arange(1, n + 1), size=trial % 5, replace=False).tolist())
        got = []
        for kernel in (True, False):
            g.host_kernels = kernel
            g._pending.append([0, None, None, trial % 2, agreed, None])
            got.append((g.probabilities(trial % 2, torch.from_numpy(conf), agreed), g._pending.pop()[5]))
        (p1, c1), (p2, c2) = got
        assert p1 == p2 and np.array_equal(c1, c2)

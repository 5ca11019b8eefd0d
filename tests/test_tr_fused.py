"""tr_fused: merging a retrieval chain into TR's template, the chain statistics, the sources of
accepted tokens, and exact tokens on a tiny random model (real text: test_lossless_methods)."""

import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.drafter import DecodeState
from specbench.hardware.cost import CostCurve
from specbench.methods.ar import Autoregressive
from specbench.methods.tr_fused import FusedTokenRecycling, merge_chain

FLAT = CostCurve(widths=[1, 100], times=[1.0, 1.3], device="cpu", dtype="float32")


def test_merge_chain_shares_the_longest_template_prefix():
    # template: root -> 1 (tok 7), 2 (tok 8); 1 -> 3 (tok 9)
    children = [[1, 2], [3], [], []]
    tokens = [0, 7, 8, 9]
    assert merge_chain(children, tokens, [7, 9, 4]) == ([1, 3], 2)  # 4 hangs below node 3
    assert merge_chain(children, tokens, [8, 9]) == ([2], 1)
    assert merge_chain(children, tokens, [5, 7]) == ([], 0)  # all of it below the root


def test_chain_hangs_below_the_shared_nodes_in_the_draft():
    d = FusedTokenRecycling(vocab_size=20, k=2, tree=[[2], [1, 0]], cost_curve=FLAT, confidence=False,
                            num_pred_tokens=2)
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
    d._chains.append((0, [5, 6, 7], 2))
    d._learn_chains(torch.tensor([1, 5]))  # one token decided, still right: wait
    assert len(d._chains) == 1
    d._learn_chains(torch.tensor([1, 5, 9]))  # second token wrong: depths 1 (hit) and 2 (miss)
    assert not d._chains
    assert d.chain_rates.trials[d._chain_cell(2, 1)] > 0 and d.chain_rates.hits[d._chain_cell(2, 2)] == 0
    assert d.chain_rates.trials[d._chain_cell(2, 3)] == 0


@pytest.mark.parametrize("settings", [{}, {"matrix": False}, {"retrieval": False}, {"max_nodes": 2}],
                         ids=["both", "retrieval_only", "matrix_only", "budget_2"])
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
        assert s["retrieval_steps"] == 0 and s["accepted_from_retrieval"] == 0
    assert max(out.step_rows) <= 1 + settings.get("max_nodes", 80)


def test_impossible_settings():
    with pytest.raises(ValueError, match="needs a source"):
        FusedTokenRecycling(vocab_size=20, cost_curve=FLAT, matrix=False, retrieval=False)
    with pytest.raises(ValueError, match="max_nodes must be at least 1"):
        FusedTokenRecycling(vocab_size=20, cost_curve=FLAT, max_nodes=0)
    with pytest.raises(ValueError, match="num_pred_tokens >= 1"):
        FusedTokenRecycling(vocab_size=20, cost_curve=FLAT, num_pred_tokens=0)

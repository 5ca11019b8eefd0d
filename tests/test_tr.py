import pytest
import torch

from specbench.methods.tr.base import TokenRecycling
from specbench.draft import DecodeState, StepOutcome
from specbench.drafter import reads_prompt_logits


def test_expansion_follows_matrix_ranks():
    tr = TokenRecycling(vocab_size=10, k=3, tree=[[2], [2, 1]])
    tr.matrix[4] = torch.tensor([7, 8, 9], dtype=torch.int32)
    tr.matrix[7] = torch.tensor([1, 2, 3], dtype=torch.int32)
    tr.matrix[8] = torch.tensor([5, 6, 0], dtype=torch.int32)
    draft = tr.propose(DecodeState(tokens=torch.tensor([0, 4]), prompt_len=1, step=0))
    # root 4 -> rank0 7, rank1 8; 7 -> 1, 2; 8 -> 5
    assert draft.tokens.tolist() == [7, 8, 1, 2, 5]
    assert draft.tree.parents == (0, 0, 1, 1, 2)


def test_update_writes_topk_of_every_row():
    tr = TokenRecycling(vocab_size=10, k=2, tree=[[2], [1, 0]])
    draft = tr.propose(DecodeState(tokens=torch.tensor([3]), prompt_len=1, step=0))
    draft.tokens = torch.tensor([5, 6, 9])
    logits = torch.zeros(4, 10)
    logits[0, [1, 2]] = torch.tensor([2.0, 1.0])  # root 3 -> [1, 2]
    logits[1, [4, 0]] = torch.tensor([5.0, 4.0])  # 5 -> [4, 0]
    logits[2, [8, 7]] = torch.tensor([3.0, 2.0])  # 6 -> [8, 7]
    logits[3, [6, 5]] = torch.tensor([9.0, 1.0])  # 9 -> [6, 5]
    tr.observe(StepOutcome(draft=draft, root=3, logits=logits, accepted=[], bonus=1))
    assert tr.matrix[3].tolist() == [1, 2]
    assert tr.matrix[5].tolist() == [4, 0]
    assert tr.matrix[6].tolist() == [8, 7]
    assert tr.matrix[9].tolist() == [6, 5]
    assert tr.matrix[0].tolist() == [0, 0]  # rows not in the draft stay as they were


def test_hot_and_cold_start():
    hot = TokenRecycling(vocab_size=10, k=2, tree=[[1]])
    hot.matrix[3] = torch.tensor([1, 2], dtype=torch.int32)
    hot.start_question()
    assert hot.matrix[3].tolist() == [1, 2]
    cold = TokenRecycling(vocab_size=10, k=2, tree=[[1]], cold_start=True)
    cold.matrix[3] = torch.tensor([1, 2], dtype=torch.int32)
    cold.start_question()
    assert cold.matrix[3].tolist() == [0, 0]


def test_tree_from_json_file(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"children": [[3], [1, 0, 0]]}')
    assert len(TokenRecycling(vocab_size=10, tree=str(p)).tree) == 4


def test_impossible_settings():
    with pytest.raises(ValueError, match="k >= 1"):
        TokenRecycling(vocab_size=10, k=0)
    with pytest.raises(ValueError, match="raise method.k"):
        TokenRecycling(vocab_size=10, k=2, tree=[[3]])
    with pytest.raises(ValueError, match="no draft nodes"):
        TokenRecycling(vocab_size=10, tree=[[0]])
    with pytest.raises(FileNotFoundError, match="tree template"):
        TokenRecycling(vocab_size=10, tree="nope.json")


def _outcome(tr, root, draft, logits, accepted, emitted):
    return StepOutcome(draft=draft, root=root, logits=logits, accepted=accepted, bonus=emitted[-1],
                       emitted=emitted)


def test_update_accepted_writes_only_the_accepted_path():
    tr = TokenRecycling(vocab_size=10, k=2, tree=[[2], [1, 0]], update="accepted")
    draft = tr.propose(DecodeState(tokens=torch.tensor([3]), prompt_len=1, step=0))
    draft.tokens = torch.tensor([5, 6, 9])  # nodes 1, 2 under the root; node 3 under node 1
    logits = torch.zeros(4, 10)
    logits[0, [5, 2]] = torch.tensor([2.0, 1.0])  # root 3 -> [5, 2]: node 1 (token 5) accepted
    logits[1, [9, 0]] = torch.tensor([5.0, 4.0])  # 5 -> [9, 0]: node 3 (token 9) accepted
    logits[2, [8, 7]] = torch.tensor([3.0, 2.0])  # 6: not on the path
    logits[3, [6, 4]] = torch.tensor([9.0, 1.0])  # 9 -> [6, 4]
    tr.observe(_outcome(tr, 3, draft, logits, accepted=[1, 3], emitted=[5, 9, 6]))
    assert tr.matrix[3].tolist() == [5, 2]
    assert tr.matrix[5].tolist() == [9, 0]
    assert tr.matrix[9].tolist() == [6, 4]
    assert tr.matrix[6].tolist() == [0, 0]  # node 2's row was verified but not accepted


def test_prefill_update_writes_a_row_per_prompt_token_last_occurrence_wins():
    tr = TokenRecycling(vocab_size=10, k=2, tree=[[1]], prefill_update=True)
    assert reads_prompt_logits(tr)
    logits = torch.zeros(3, 10)
    logits[0, [1, 2]] = torch.tensor([2.0, 1.0])
    logits[1, [3, 4]] = torch.tensor([2.0, 1.0])
    logits[2, [5, 6]] = torch.tensor([2.0, 1.0])
    tr.observe_prompt(torch.tensor([7, 8, 7]), logits)
    assert tr.matrix[7].tolist() == [5, 6] and tr.matrix[8].tolist() == [3, 4]
    assert not reads_prompt_logits(TokenRecycling(vocab_size=10, k=2, tree=[[1]]))
    with pytest.raises(ValueError, match="method.update must be one of all_rows, accepted"):
        TokenRecycling(vocab_size=10, update="sometimes")


def test_statistics_count_nodes_and_the_roots_matrix_row():
    tr = TokenRecycling(vocab_size=10, k=2, tree=[[2], [1, 0]])
    logits = torch.zeros(4, 10)
    logits[:, 5] = 1.0  # every row's top-1 is 5
    # step 1: root 3's row never written; target chose 5, node 1 carried token 0: nothing accepted
    d = tr.propose(DecodeState(tokens=torch.tensor([3]), prompt_len=1, step=0))
    tr.observe(_outcome(tr, 3, d, logits, accepted=[], emitted=[5]))
    # step 2: root 3 again, its row now written (rank 0 = 5), and the target chose 5: node 1
    d = tr.propose(DecodeState(tokens=torch.tensor([3, 3]), prompt_len=1, step=1))
    assert d.tokens.tolist()[0] == 5
    tr.observe(_outcome(tr, 3, d, logits, accepted=[1], emitted=[5, 5]))
    s = tr.take_statistics()
    assert s["tree"] == [[2], [1, 0]]
    assert s["steps"] == 2 and s["node_hits"] == [1, 0, 0] and s["node_drafted"] == [2, 2, 2]
    assert s["depth_hits"] == [1, 0]
    assert s["root_row_unwritten"] == 1 and s["root_rank0_hits"] == 1
    assert tr.take_statistics()["steps"] == 0  # taken means forgotten


def test_prompt_logits_from_the_engine_are_the_models_and_tokens_stay_exact(tiny_llama):
    from specbench.decoding.engine import Engine
    from specbench.methods.ar import Autoregressive

    prompt = [5, 17, 3, 17, 42, 8]
    seen = {}

    class Spy(TokenRecycling):
        def observe_prompt(self, prompt_ids, logits):
            seen["ids"], seen["logits"] = prompt_ids.clone(), logits.clone()
            super().observe_prompt(prompt_ids, logits)

    engine = Engine(tiny_llama, eos_token_ids=[])
    tr = Spy(vocab_size=97, k=4, tree=[[2], [1, 1]], prefill_update=True)
    out = engine.generate(prompt, tr, 12)
    ar = engine.generate(prompt, Autoregressive(), 12)
    assert out.tokens == ar.tokens
    full = tiny_llama(input_ids=torch.tensor([prompt])).logits[0]
    assert seen["ids"].tolist() == prompt
    torch.testing.assert_close(seen["logits"], full, rtol=1e-4, atol=1e-4)


def test_adaptive_statistics_name_template_nodes():
    from specbench.speculation.cost import CostCurve
    from specbench.methods.tr.adaptive import AdaptiveTokenRecycling

    curve = CostCurve(widths=[1, 2, 3, 4], times=[1.0, 1.0, 1.0, 1.0], device="cpu", dtype="float32")
    tr = AdaptiveTokenRecycling(vocab_size=10, k=2, tree=[[2], [1, 0]], cost_curve=curve, confidence=False)
    tr.chooser.drafted = (1, 3)  # the chooser picked template nodes 1 and 3: sub-tree nodes 1 and 2
    from specbench.draft import DraftTree
    d = __import__("specbench.drafter", fromlist=["Draft"]).Draft(tokens=torch.tensor([5, 5]), tree=DraftTree([0, 1]))
    tr.observe(_outcome(tr, 3, d, torch.zeros(3, 10), accepted=[1, 2], emitted=[5, 5, 0]))
    s = tr.take_statistics()
    assert s["node_hits"] == [1, 0, 1] and s["node_drafted"] == [1, 0, 1]


@pytest.mark.parametrize("method", ["tr", "tr_accepted", "tr_adaptive", "tr_fused", "samd"])
def test_a_batched_step_teaches_the_shared_matrix_what_the_requests_would_in_turn(method):
    """observe_batch (one top-k and one write for the batch) leaves the shared matrix, its confidences
    and each request's counts as observing one request after another does; requests repeat tokens,
    so the later request's row must win."""
    from specbench.speculation.cost import CostCurve
    from specbench.methods.samd import SAMDecoding
    from specbench.methods.tr.adaptive import AdaptiveTokenRecycling
    from specbench.methods.tr.fused import FusedTokenRecycling

    flat = CostCurve(widths=[1, 100], times=[1.0, 1.0001], device="cpu", dtype="float32")
    build = {"tr": lambda: TokenRecycling(vocab_size=12, k=2, tree=[[2], [1, 0]]),
             "tr_accepted": lambda: TokenRecycling(vocab_size=12, k=2, tree=[[2], [1, 0]], update="accepted"),
             "tr_adaptive": lambda: AdaptiveTokenRecycling(vocab_size=12, k=2, tree=[[2], [1, 0]], cost_curve=flat,
                                                           confidence=True, min_gain=-1.0),
             "tr_fused": lambda: FusedTokenRecycling(vocab_size=12, k=2, tree=[[2], [1, 0]], cost_curve=flat,
                                                     confidence=True, min_gain=-1.0),
             "samd": lambda: SAMDecoding(vocab_size=12, k=2, tree=[[2], [1, 0]])}[method]

    def batch():
        made = [build() for _ in range(3)]
        for d in made[1:]:
            d.share_learned_state(made[0])
        return made

    in_turn, at_once = batch(), batch()
    g = torch.Generator().manual_seed(0)
    contexts = [[1, 3], [2, 3], [4, 5]]  # requests 0 and 1 share the root 3
    for step in range(6):
        per_request = []
        for b, ctx in enumerate(contexts):
            state = DecodeState(tokens=torch.tensor(ctx), prompt_len=1, step=step)
            drafts = [d.propose(state) for d in (in_turn[b], at_once[b])]
            plain = (step + b) % 3 == 0  # a request that decodes plainly this step (the policy's cut)
            draft = None if plain else drafts[0]
            assert plain or drafts[0].tokens.tolist() == drafts[1].tokens.tolist()
            rows = 1 if draft is None else len(draft.tree) + 1
            logits = torch.randn(rows, 12, generator=g)
            accepted = [] if draft is None else [1][: int(torch.randint(0, 2, (1,), generator=g))]
            emitted = [int(logits[0].argmax())] if not accepted else [int(draft.tokens[0]), int(logits[1].argmax())]
            per_request.append((draft, drafts[1] if not plain else None, logits, accepted, emitted))
            ctx.extend(emitted)
        for b, (draft, _, logits, accepted, emitted) in enumerate(per_request):
            in_turn[b].observe(StepOutcome(draft=draft, root=contexts[b][-len(emitted) - 1], logits=logits,
                                           accepted=accepted, bonus=emitted[-1], emitted=emitted))
        type(at_once[0]).observe_batch(at_once, [
            StepOutcome(draft=twin, root=contexts[b][-len(emitted) - 1], logits=logits, accepted=accepted,
                        bonus=emitted[-1], emitted=emitted)
            for b, (_, twin, logits, accepted, emitted) in enumerate(per_request)])
        assert torch.equal(in_turn[0].source.matrix, at_once[0].source.matrix)
        assert torch.equal(in_turn[0].source.written, at_once[0].source.written)
        if in_turn[0].source.probs is not None:
            assert torch.equal(in_turn[0].source.probs, at_once[0].source.probs)
    for a, b in zip(in_turn, at_once):
        sa, sb = a.take_statistics(), b.take_statistics()
        # the root facts are read before the step's writes at once, after earlier requests' in turn
        for key in ("root_row_unwritten", "root_rank0_hits"):
            sa.pop(key), sb.pop(key)
        assert sa == sb and sa["steps"] == 6



"""Batched speculative decoding (specbench/decoding/batched.py): each request in a batch emits exactly
what the single-request Engine emits for it alone, with continuous batching and arrival times."""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.batched import BatchedEngine, Request
from specbench.decoding.engine import Engine
from specbench.drafter import ReadsHiddenStates
from specbench.methods.pld import PromptLookup
from specbench.registry import build_drafter
from tests.conftest import position_sampler

V = 97
EOS = [3]  # the tiny model emits it now and then: truncation at EOS is exercised too
METHODS = {"ar": lambda: build_drafter("ar"),
           "pld": lambda: build_drafter("pld", vocab_size=V),
           "tr": lambda: build_drafter("tr", vocab_size=V),  # the published tree: about 80 rows a step
           # a small tree, and prompt logits through observe_prompt
           "tr[prefill]": lambda: build_drafter("tr", vocab_size=V, k=4, tree=[[4], [2, 2, 1, 1]],
                                                prefill_update=True)}


def tiny_prompts(lengths, seed=0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]


def alone(model, eos, prompt, make, max_new, sampler=None):
    return Engine(model, eos).generate(prompt, make(), max_new, sampler)


MIXED = ["ar", "tr", "pld", "tr[prefill]", "tr"]  # one batch, rows of different widths: padding rows


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("method", list(METHODS) + ["mixed"])
def test_batch_equals_single_requests(tiny_llama, method, temperature):
    prompts = tiny_prompts([5, 12, 3, 20, 8])
    budgets = [20, 9, 30, 14, 25]
    makes = [METHODS[m] for m in MIXED] if method == "mixed" else [METHODS[method]] * len(prompts)
    refs = [alone(tiny_llama, EOS, p, make, n, position_sampler(temperature, i))
            for i, (p, make, n) in enumerate(zip(prompts, makes, budgets))]
    reqs = [Request(p, n, make, position_sampler(temperature, i))
            for i, (p, make, n) in enumerate(zip(prompts, makes, budgets))]
    out = BatchedEngine(tiny_llama, EOS).generate(reqs, max_batch=3)
    for i, (rec, ref) in enumerate(zip(out.records, refs)):
        assert rec.tokens == ref.tokens, f"request {i} ({method}, T={temperature}) differs from decoding it alone"
    assert max(s.active for s in out.steps) == 3
    if method in ("pld", "mixed"):  # slots of different widths shared a step
        assert any(s.rows > s.real_rows for s in out.steps)
    # accepted drafts, so kept rows were gathered (at T=0.8 the random model is too flat for PLD's and
    # the small tree's drafts to be accepted: their equality there rests on rejected drafts alone)
    if method != "ar" and (temperature == 0 or method in ("tr", "mixed")):
        assert sum(n for r in out.records for n in r.accept_lengths) > sum(r.decoding_steps for r in out.records)
    if temperature == 0:  # some request stopped at EOS before its budget
        assert any(r.tokens[-1] in EOS and len(r.tokens) < n for r, n in zip(out.records, budgets))


def test_batch_of_one_is_the_engine(tiny_llama):
    prompts = tiny_prompts([7, 15, 4], seed=1)
    make = METHODS["tr"]
    refs = [alone(tiny_llama, EOS, p, make, 24) for p in prompts]
    out = BatchedEngine(tiny_llama, EOS).generate([Request(p, 24, make) for p in prompts], max_batch=1)
    for rec, ref in zip(out.records, refs):
        assert (rec.tokens, rec.accept_lengths, rec.step_rows, rec.decoding_steps) == \
            (ref.tokens, ref.accept_lengths, ref.step_rows, ref.decoding_steps)
    assert all(s.active == 1 and s.rows == s.real_rows for s in out.steps)
    assert len(out.steps) == sum(ref.decoding_steps for ref in refs)


def test_sliding_window_model(tiny_gemma):
    """Gemma 3 in miniature (window 4): prompts and outputs far past the window, one mask per layer type."""
    prompts = tiny_prompts([9, 3, 14], seed=2)
    refs = [alone(tiny_gemma, [], p, METHODS["tr"], 16) for p in prompts]
    out = BatchedEngine(tiny_gemma, []).generate([Request(p, 16, METHODS["tr"]) for p in prompts], max_batch=3)
    assert [r.tokens for r in out.records] == [r.tokens for r in refs]


class _Spy(PromptLookup, ReadsHiddenStates):
    """PLD that asks for hidden states and keeps what every step showed it."""

    def __init__(self):
        super().__init__(vocab_size=V)
        self.seen = []

    def observe(self, outcome):
        self.seen.append((outcome.logits.clone(), outcome.hidden_states.clone(), outcome.draft))


def test_each_slot_sees_its_own_rows(tiny_llama):
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [1, 2], [9, 9, 9, 9, 9, 9, 9]]  # PLD drafts on some, not all
    singles = [_Spy() for _ in prompts]
    for p, spy in zip(prompts, singles):
        Engine(tiny_llama, []).generate(p, spy, 12)
    batched = [_Spy() for _ in prompts]
    BatchedEngine(tiny_llama, []).generate([Request(p, 12, d) for p, d in zip(prompts, batched)], max_batch=3)
    drafted = 0
    for one, many in zip(singles, batched):
        assert len(one.seen) == len(many.seen)
        for (l1, h1, d1), (l2, h2, d2) in zip(one.seen, many.seen):
            rows = 1 if d1 is None else d1.tree.size
            drafted += d1 is not None
            assert l2.shape[0] == h2.shape[0] == rows and (d2 is None) == (d1 is None)
            torch.testing.assert_close(l2, l1, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(h2, h1, atol=1e-5, rtol=1e-4)
    assert drafted > 0


def test_continuous_batching_reuses_freed_slots(tiny_llama):
    prompts = tiny_prompts([6, 10, 4, 8], seed=3)
    budgets = [4, 16, 6, 6]
    make = METHODS["pld"]
    out = BatchedEngine(tiny_llama, []).generate([Request(p, n, make) for p, n in zip(prompts, budgets)], max_batch=2)
    r = out.records
    assert [x.tokens for x in r] == [alone(tiny_llama, [], p, make, n).tokens for p, n in zip(prompts, budgets)]
    assert max(s.active for s in out.steps) == 2
    assert r[0].admitted < r[1].admitted < r[2].admitted < r[3].admitted
    # request 0 (4 tokens) finishes first; request 2 takes its batch row at once, while 1 still runs
    assert r[0].finished <= r[2].admitted < r[1].finished and r[2].slot == r[0].slot
    # request 3 waits for the next row to free up: request 2's (6 tokens), while 1 (16) still runs
    assert r[2].finished <= r[3].admitted < r[1].finished and r[3].slot == r[2].slot
    assert all(x.admitted <= x.first_token <= x.finished for x in r)
    assert sum(s.active for s in out.steps) == sum(x.decoding_steps for x in r)


def test_arrivals_wait_for_their_time(tiny_llama):
    prompts = tiny_prompts([5, 7, 6], seed=4)
    reqs = [Request(p, 8, METHODS["ar"], arrival=a) for p, a in zip(prompts, [0.0, 0.0, 0.3])]
    out = BatchedEngine(tiny_llama, []).generate(reqs, max_batch=3)
    r = out.records
    assert r[0].admitted < 0.3 and r[1].admitted < 0.3
    assert r[2].arrival == 0.3 and r[2].admitted >= 0.3
    assert r[0].finished < 0.3  # the first two were done long before: the engine slept, then admitted it
    assert out.wall_time >= 0.3
    assert [x.tokens for x in r] == [alone(tiny_llama, [], p, METHODS["ar"], 8).tokens for p in prompts]


CHATS = ["What is the capital of France? Answer in one sentence.",
         "Write a haiku about the sea.",
         "Summarize: The cat sat on the mat. The dog barked at the cat. The cat ran away and hid under the bed."]


@pytest.mark.parametrize("method", ["ar", "pld"])
def test_real_model_batch_equals_single_requests(real_model, method):
    from specbench.inputs.chat import prompt_ids

    model, tok, eos = real_model
    prompts = [prompt_ids(tok, [{"role": "user", "content": c}]) for c in CHATS]
    assert len({len(p) for p in prompts}) == 3  # different lengths: holes in the shared cache
    make = lambda: build_drafter(method, vocab_size=model.get_output_embeddings().weight.shape[0])  # noqa: E731
    refs = [Engine(model, eos).generate(p, make(), 24) for p in prompts]
    out = BatchedEngine(model, eos).generate([Request(p, 24, make) for p in prompts], max_batch=2)
    for i, (rec, ref) in enumerate(zip(out.records, refs)):
        assert rec.tokens == ref.tokens, f"{method}: chat {i} differs from decoding it alone"
    assert max(s.active for s in out.steps) == 2
    if method == "pld":  # accepted drafts (kept rows gathered) beside plain steps (padding rows)
        assert any(n > 1 for r in out.records for n in r.accept_lengths)
        assert any(s.rows > s.real_rows for s in out.steps)

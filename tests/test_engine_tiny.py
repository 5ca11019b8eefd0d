"""Tree attention, position ids and KV compaction against sequential decoding, on tiny random models."""

import pytest
import torch
from transformers import DynamicCache

from specbench.methods.ar import Autoregressive
from specbench.methods.tr.base import TokenRecycling
from specbench.draft import Draft
from specbench.decoding.engine import Engine
from specbench.decoding.kv_cache import compact_kv_cache, with_cache
from specbench.draft import DraftTree


def sequential_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def prefill(model, ids):
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), **with_cache(model, cache), use_cache=True)
    return cache


TREE = DraftTree((0, 0, 1, 1, 2, 3))  # root -> 1, 2; 1 -> 3, 4; 2 -> 5; 3 -> 6


@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_gemma"])
def test_tree_rows_equal_sequential_logits(model_name, request):
    model = request.getfixturevalue(model_name)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 97, (12,), generator=g).tolist()  # longer than gemma's window of 4
    root = 5
    draft = Draft(tokens=torch.randint(0, 97, (len(TREE),), generator=g), tree=TREE)
    engine = Engine(model, eos_token_ids=[])
    cache = prefill(model, prefix)
    logits, _ = engine.forward_rows(cache, len(prefix), draft, root)
    toks = draft.tokens.tolist()
    for node in range(TREE.size):
        path = [toks[n - 1] for n in TREE.path_to(node)] if node else []
        expect = sequential_logits(model, prefix + [root] + path)
        torch.testing.assert_close(logits[node], expect, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_gemma"])
def test_kv_compaction_after_partial_acceptance(model_name, request):
    model = request.getfixturevalue(model_name)
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 97, (10,), generator=g).tolist()
    root = 7
    draft = Draft(tokens=torch.randint(0, 97, (len(TREE),), generator=g), tree=TREE)
    engine = Engine(model, eos_token_ids=[])
    cache = prefill(model, prefix)
    engine.forward_rows(cache, len(prefix), draft, root)
    accepted = [2, 5]  # a path that is not the first rows: needs a real gather
    compact_kv_cache(cache, len(prefix), [0] + accepted)
    assert cache.get_seq_length() == len(prefix) + 3
    kept = [draft.tokens[a - 1].item() for a in accepted]
    nxt = 3
    logits, _ = engine.forward_rows(cache, cache.get_seq_length(), None, nxt)
    torch.testing.assert_close(logits[0], sequential_logits(model, prefix + [root] + kept + [nxt]),
                               atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_gemma"])
def test_tr_equals_ar_on_random_model(model_name, request):
    model = request.getfixturevalue(model_name)
    engine = Engine(model, eos_token_ids=[])
    prompt = list(range(3, 20))
    ar = engine.generate(prompt, Autoregressive(), 40)
    tr = TokenRecycling(vocab_size=97)
    for _ in range(2):  # the second run drafts from a warm matrix, so many nodes are verified
        out = engine.generate(prompt, tr, 40)
        assert out.tokens == ar.tokens
    assert sum(out.accept_lengths) + 1 == out.new_tokens
    assert max(out.accept_lengths) > 1


def test_steps_record_drafted_nodes_and_times(tiny_llama):
    from specbench.methods.lookahead import Lookahead

    engine = Engine(tiny_llama, eos_token_ids=[])
    prompt = list(range(3, 20))
    for drafter in (Autoregressive(), TokenRecycling(vocab_size=97), Lookahead(vocab_size=97)):
        out = engine.generate(prompt, drafter, 20)
        assert len(out.step_drafted) == len(out.step_times) == out.decoding_steps > 0
        assert all(t > 0 for t in out.step_times)
        # steps run back to back from the prefill's end: together they are the decoding time
        assert sum(out.step_times) == pytest.approx(out.wall_time - out.prefill_time, rel=0.05)
        extra = [rows - 1 - n for rows, n in zip(out.step_rows, out.step_drafted)]
        if isinstance(drafter, Autoregressive):
            assert set(out.step_drafted) == {0}
        elif isinstance(drafter, TokenRecycling):
            assert set(out.step_drafted) == {80} and set(extra) == {0}  # the published tree, every step
        else:  # Lookahead's window rows are verified but never drafts
            assert max(extra) > 0


def test_ar_matches_transformers_generate_on_tiny_gemma(tiny_gemma):
    engine = Engine(tiny_gemma, eos_token_ids=[])
    prompt = list(range(3, 15))
    ours = engine.generate(prompt, Autoregressive(), 20).tokens
    ref = tiny_gemma.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref


def test_eos_and_budget_stop_generation(tiny_llama):
    engine = Engine(tiny_llama, eos_token_ids=[])
    prompt = list(range(3, 20))
    full = engine.generate(prompt, Autoregressive(), 30).tokens
    assert len(engine.generate(prompt, Autoregressive(), 7).tokens) == 7
    eos = full[4]
    stop = Engine(tiny_llama, eos_token_ids=[eos]).generate(prompt, TokenRecycling(vocab_size=97), 30)
    assert stop.tokens == full[: full.index(eos) + 1]
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate(prompt, Autoregressive(), 0)


@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_gemma"])
@pytest.mark.parametrize("make", [Autoregressive, lambda: TokenRecycling(vocab_size=97)])
def test_a_kept_prefix_decodes_what_a_whole_prefill_decodes(model_name, make, request):
    """Prefix caching across a conversation's turns: turn 2 prefills only what its prompt does not
    share with turn 1's prompt and answer, and decodes the same tokens as a turn prefilled whole."""
    from specbench.decoding.engine import KeptPrefix

    model = request.getfixturevalue(model_name)
    engine = Engine(model, eos_token_ids=[])
    first = list(range(3, 40))
    kept = KeptPrefix()
    one = engine.generate(first, make(), 24, prefix=kept)
    assert one.prefix_reused == 0 and one.tokens == engine.generate(first, make(), 24).tokens
    assert kept.tokens == first + one.tokens[:-1]  # the last token is the next root: not in the cache
    # the answer comes back re-encoded with a different last token, then the next user turn
    second = first + one.tokens[:-3] + [7, 8, 9, 10, 11, 12]
    two = engine.generate(second, make(), 24, prefix=kept)
    assert two.prefix_reused == len(first) + len(one.tokens) - 3
    assert two.tokens == engine.generate(second, make(), 24).tokens
    third = [3, 4, 5] + [50] * 10  # sharing three tokens only
    assert engine.generate(third, make(), 8, prefix=kept).prefix_reused == 3


def test_a_kept_prefix_keeps_the_prompts_last_token_to_prefill(tiny_llama):
    from specbench.decoding.engine import KeptPrefix, shared_prefix

    assert shared_prefix([1, 2, 3, 4], [1, 2, 3, 4]) == 3  # the last prompt token is always prefilled
    assert shared_prefix([1, 2, 3, 4], [1, 2, 9, 4, 5]) == 2
    assert shared_prefix([], [1, 2]) == 0 and shared_prefix([5], [1, 2]) == 0
    engine = Engine(tiny_llama, eos_token_ids=[])
    kept = KeptPrefix()
    prompt = list(range(3, 30))
    engine.generate(prompt, Autoregressive(), 5, prefix=kept)
    again = engine.generate(prompt, Autoregressive(), 5, prefix=kept)  # the same prompt again
    assert again.prefix_reused == len(prompt) - 1
    assert again.tokens == engine.generate(prompt, Autoregressive(), 5).tokens

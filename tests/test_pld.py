"""Prompt Lookup Decoding: n-gram matching on hand-made sequences, and equality with AR."""

from __future__ import annotations

import pytest
import torch

from specbench.drafting.ngram import find_candidate
from specbench.methods.pld import PromptLookup
from specbench.draft import DecodeState
from specbench.registry import build_drafter

T = lambda *xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731


def test_earliest_match_wins():
    # "7 8 9" occurs at 0 and at 6; the query is the trailing "7 8 9"
    seq = T(7, 8, 9, 1, 2, 3, 7, 8, 9, 4, 5, 6, 0, 0, 0, 7, 8, 9)
    assert find_candidate(seq, 3, 3).tolist() == [1, 2, 3]


def test_longest_ngram_first_then_shorter():
    # trigram "5 6 7" matches at 6 (-> 8 9); a bigram "6 7" would match earlier at 1 (-> 1 1)
    seq = T(0, 6, 7, 1, 1, 0, 5, 6, 7, 8, 9, 0, 0, 5, 6, 7)
    assert find_candidate(seq, 3, 2).tolist() == [8, 9]
    # no trigram or bigram match: falls back to the unigram "7" (earliest at 2)
    seq = T(3, 4, 7, 2, 2, 1, 1, 1, 5, 7)
    assert find_candidate(seq, 3, 2).tolist() == [2, 2]
    # with max_ngram_size=1 the unigram wins directly
    seq = T(0, 6, 7, 1, 1, 0, 5, 6, 7, 8, 9, 0, 0, 5, 6, 7)
    assert find_candidate(seq, 1, 2).tolist() == [1, 1]


def test_bigram_when_no_trigram():
    seq = T(1, 4, 5, 6, 6, 9, 9, 9, 2, 4, 5)
    assert find_candidate(seq, 3, 3).tolist() == [6, 6, 9]


def test_no_match_gives_none_and_ar_step():
    seq = T(1, 2, 3, 4, 5, 6)
    assert find_candidate(seq, 3, 10) is None
    d = PromptLookup(vocab_size=10)
    assert d.propose(DecodeState(tokens=seq, prompt_len=3, step=0)) is None


def test_continuation_must_fit_and_not_be_the_query_itself():
    # the only earlier "1 2" is at 0; its continuation may run into the query (as in the
    # reference) but not past the end of the sequence
    seq = T(1, 2, 8, 9, 1, 2)
    assert find_candidate(seq, 2, 4).tolist() == [8, 9, 1, 2]
    assert find_candidate(seq, 2, 5) is None  # and the unigram "2" (at 1) is 1 token short too
    # the query itself (the last n tokens) never matches itself
    assert find_candidate(T(3, 1, 2), 2, 1) is None
    # a single token: nothing to match
    assert find_candidate(T(5), 3, 10) is None


def test_the_drafter_searches_in_our_kernel_on_a_cpu_target(packed_kernel, monkeypatch):
    """A CPU target's drafter takes the kernel (built when the drafter is); it finds what numpy finds."""
    import specbench.methods.pld as pld

    calls = []
    monkeypatch.setattr(pld, "find_candidate", lambda *a: calls.append(a[-1]) or find_candidate(*a))
    d = build_drafter("pld", vocab_size=20, device="cpu", num_pred_tokens=2)
    seq = T(1, 2, 3, 4, 1, 2)
    assert d.propose(DecodeState(tokens=seq, prompt_len=2, step=0)).tokens.tolist() == [3, 4]
    assert calls == [True]


def test_drafter_returns_a_chain():
    seq = T(7, 8, 9, 1, 2, 3, 4, 0, 7, 8, 9)
    d = build_drafter("pld", vocab_size=10, device="cpu", max_ngram_size=3, num_pred_tokens=4)
    draft = d.propose(DecodeState(tokens=seq, prompt_len=5, step=0))
    assert draft.tokens.tolist() == [1, 2, 3, 4]
    assert draft.tree.is_chain and len(draft.tree) == 4


def test_bad_settings():
    with pytest.raises(ValueError, match="max_ngram_size"):
        PromptLookup(vocab_size=10, max_ngram_size=0)


def test_one_value_check_before_loading_and_when_built():
    """The Settings dataclass checks its values: the run's check before any model loads
    (check_settings) and the constructor refuse with the same message."""
    from specbench.errors import SettingsError

    with pytest.raises(SettingsError) as before:
        PromptLookup.check_settings({"num_pred_tokens": 0}, {})
    with pytest.raises(SettingsError) as built:
        PromptLookup(vocab_size=10, num_pred_tokens=0)
    assert str(before.value) == str(built.value)
    assert PromptLookup.check_settings({"num_pred_tokens": 4}, {})["num_pred_tokens"] == 4


def test_every_method_s_defaults_pass_its_own_check():
    from specbench import registry

    for name in registry.available_methods():
        cls = registry.drafter_class(name)
        cls.Settings()  # the defaults are values the method accepts


@pytest.fixture(params=[True, False], ids=["kernel", "numpy"])
def kernel(request):
    """The n-gram search on our kernel (decoding/ngram_search.cpp), or on numpy's calls."""
    if request.param:
        request.getfixturevalue("packed_kernel")
    return request.param


def test_matches_reference_on_random_sequences(kernel):
    """Same answer as a plain loop over the reference's conditions, on either path (short sequences over
    a small vocabulary, so that matches, misses and every boundary come up)."""
    g = torch.Generator().manual_seed(0)

    def reference(seq, max_n, k):
        L = len(seq)
        s = seq.tolist()
        for n in range(min(max_n, L - 1), 0, -1):
            q = s[-n:]
            for i in range(L - n + 1):
                if s[i:i + n] == q and i + n + k <= L and i + n < L - n:
                    return s[i + n:i + n + k]
        return None

    for _ in range(300):
        L = int(torch.randint(2, 40, (1,), generator=g))
        seq = torch.randint(0, 4, (L,), generator=g)
        for max_n, k in ((3, 10), (3, 2), (2, 1), (1, 5)):
            got = find_candidate(seq, max_n, k, kernel)
            assert (None if got is None else got.tolist()) == reference(seq, max_n, k)
    for L in (1, 2, 3, 500):  # a long context with a match near its end, and the shortest ones
        seq = torch.arange(L)
        if L == 500:
            seq[-3:] = torch.tensor([470, 471, 472])
        got = find_candidate(seq, 3, 10, kernel)
        assert (None if got is None else got.tolist()) == reference(seq, 3, 10)

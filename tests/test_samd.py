"""SAM-Decoding: the suffix automaton against brute force, the choice between its chain and Token
Recycling's tree, the static corpus and its bias, exact tokens on a tiny random model, and bad
settings refused in one line (real text, T > 0, half precision: test_lossless_methods, test_half_precision)."""

import random
import re

import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.draft import DecodeState
from specbench.errors import SettingsError
from specbench.methods.ar import Autoregressive
from specbench.drafting.datastore import build_datastore
from specbench.methods.samd import SAMD_TREE, SAMDecoding
from specbench.drafting.suffix_automaton import Match, SuffixAutomaton, feed, follow
from tests.test_bad_inputs import run_in_process


# -- the automaton -------------------------------------------------------------------------------

def ends(text, s):
    """End positions (tokens up to and including the occurrence) of every occurrence of s in text."""
    return [i + len(s) for i in range(len(text) - len(s) + 1) if text[i : i + len(s)] == s]


def longest_suffix_in(text, query):
    """(length, end of its first occurrence) of the longest suffix of query occurring in text."""
    for n in range(len(query), 0, -1):
        found = ends(text, query[-n:])
        if found:
            return n, min(found)
    return 0, 0


def random_texts(count, seed=0):
    rng = random.Random(seed)
    for _ in range(count):  # small alphabets: many repeats, many state splits
        yield [rng.randrange(rng.randint(2, 4)) for _ in range(rng.randint(1, 30))]


def test_step_finds_the_longest_suffix_and_its_first_occurrence():
    rng = random.Random(1)
    for text in random_texts(150):
        sam = SuffixAutomaton(text)
        for _ in range(5):
            query = [rng.randrange(4) for _ in range(rng.randint(1, 8))]
            m = follow(sam, Match(), query)
            n, first_end = longest_suffix_in(text, query)
            assert m.length == n, (text, query)
            if n:
                assert sam.first_end[m.state] == first_end
                assert sam.continuation(m.state, 3) == text[first_end : first_end + 3]


def test_feed_follows_the_longest_earlier_suffix_and_keeps_it_in_its_state():
    """After every token, the match is the longest suffix of the text that ends earlier in it, and
    its state is the one holding a string of that length: an append that splits the state moves the
    match to the clone (without `settle` the state goes stale after nearly every split)."""
    for text in random_texts(150, seed=2):
        sam, m = SuffixAutomaton(), Match()
        for i, t in enumerate(text):
            m = feed(sam, m, [t])
            assert m.length == longest_suffix_in(text[:i], text[: i + 1])[0]
            if m.length:
                assert sam.length[sam.link[m.state]] < m.length <= sam.length[m.state]
            for root in range(4):  # the drafting lookup: the text plus a root, in the text
                n, first_end = longest_suffix_in(text[: i + 1], text[: i + 1] + [root])
                q = sam.step(m, root)
                assert q.length == n and (not n or sam.first_end[q.state] == first_end)
        assert sam.tokens == text and sam.n_states <= max(2 * len(text) - 1, 2)


def test_a_match_near_the_end_gives_way_to_a_shorter_one_with_room():
    sam = SuffixAutomaton([1, 2, 5, 6, 7, 8, 9, 1, 2, 4, 9, 1, 2])
    recent = follow(sam, Match(), [9, 1, 2]).state  # first ends 4 tokens before the text's end
    assert sam.continuation(recent, 5) == [4, 9, 1, 2]
    assert sam.with_room(recent, 4) == recent
    earlier = sam.with_room(recent, 5)  # "1 2" first ends at 2
    assert sam.length[earlier] == 2 and sam.continuation(earlier, 5) == [5, 6, 7, 8, 9]
    assert sam.with_room(follow(sam, Match(), [2]).state, 50) == follow(sam, Match(), [2]).state  # never empty


def test_documents_are_kept_apart():
    sam = SuffixAutomaton.from_documents([[1, 2, 3, 4], [5, 1, 2]])
    assert follow(sam, Match(), [3, 4, 5]).length == 1  # "4 5" spans the two documents
    assert sam.continuation(follow(sam, Match(), [1, 2]).state, 10) == [3, 4]  # cut at the document's end
    assert follow(sam, Match(), [5, 1, 2]).length == 3


# -- the drafter ---------------------------------------------------------------------------------

def propose(d, seq, step=0):
    return d.propose(DecodeState(tokens=torch.tensor(seq), prompt_len=1, step=step))


def test_a_long_enough_match_drafts_its_continuation_else_the_tree():
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1, 2, 3, 4, 5]  # the root "5" ends a 5-token match
    d = SAMDecoding(vocab_size=20, max_draft=4)
    assert d.source.template.parents == SAMDecoding(vocab_size=20, tree=SAMD_TREE).source.template.parents
    assert len(d.source.template) == 60
    draft = propose(d, seq)
    assert draft.tree.is_chain and draft.tokens.tolist() == [6, 7, 8, 9] and d._source == "dynamic"
    d = SAMDecoding(vocab_size=20, len_threshold=6)
    draft = propose(d, seq)
    assert len(draft.tree) == 60 and d._source == "tree"
    # the matrix fills the tree: root 5's row ranks its children
    d.matrix[5] = torch.arange(8, 16, dtype=torch.int32)
    assert propose(d, seq).tokens[:7].tolist() == list(range(8, 15))


def test_growing_the_automaton_step_by_step_equals_building_it_at_once():
    rng = random.Random(3)
    base = [rng.randrange(6) for _ in range(40)]
    stepwise = SAMDecoding(vocab_size=6, len_threshold=2, max_draft=5)
    draws = []
    for n in range(10, 41, 3):  # a turn's steps: decided tokens arrive a few at a time
        draws.append(propose(stepwise, base[:n], step=int(n > 10)).tokens.tolist())
    fresh = [propose(SAMDecoding(vocab_size=6, len_threshold=2, max_draft=5), base[:n]).tokens.tolist()
             for n in range(10, 41, 3)]
    assert draws == fresh and {len(x) <= 5 for x in draws} == {True, False}  # chains and trees
    # a new turn (step 0) starts a new automaton: nothing from the last turn matches
    d = SAMDecoding(vocab_size=20, len_threshold=2)
    propose(d, [1, 2, 3, 4, 1, 2])
    assert d._source == "dynamic"
    propose(d, [9, 1, 2], step=0)
    assert d._source == "tree"


@pytest.fixture
def corpus(tmp_path):
    """A datastore whose corpus holds 1..12 and, as a second document, 13..15."""
    build_datastore([list(range(1, 13)), [13, 14, 15]], tmp_path / "store", vocab_size=20)
    return str(tmp_path / "store")


def test_a_static_match_counts_len_bias_tokens_less(corpus):
    d = SAMDecoding(vocab_size=20, static_corpus=corpus)  # len_threshold 5, len_bias 5
    assert propose(d, [19, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).tokens.tolist() == [11, 12]  # 10 - 5 >= 5
    assert d._source == "static"
    propose(d, [19, 1, 2, 3, 4, 5, 6, 7, 8, 9], step=0)  # 9 - 5 < 5
    assert d._source == "tree"
    d = SAMDecoding(vocab_size=20, static_corpus=corpus, len_bias=0)
    assert len(propose(d, [19, 8, 9, 10, 11, 12]).tree) == 60  # a document's end: nothing follows 12
    assert d._source == "tree"
    assert propose(d, [19, 4, 5, 6, 7, 8], step=0).tokens.tolist() == list(range(9, 13))
    # the dynamic match wins a tie
    d = SAMDecoding(vocab_size=20, static_corpus=corpus, len_bias=0)
    assert propose(d, [1, 2, 3, 4, 5, 18, 17, 1, 2, 3, 4, 5]).tokens.tolist()[:2] == [18, 17]
    assert d._source == "dynamic"


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "with_static_corpus"])
def test_exact_tokens_and_sources_on_a_tiny_model(tiny_llama, static, tmp_path):
    engine = Engine(tiny_llama, eos_token_ids=[])
    prompt = [5, 17, 3, 17, 42, 8, 5, 17, 3, 9, 11, 5, 17]
    ar = engine.generate(prompt, Autoregressive(), 60)
    settings = {}
    if static:  # the corpus holds AR's own answer: the static automaton drafts from the first step
        build_datastore([prompt + ar.tokens], tmp_path / "store", vocab_size=97)
        settings = dict(static_corpus=str(tmp_path / "store"), len_bias=0)
    d = SAMDecoding(vocab_size=97, **settings)
    out = engine.generate(prompt, d, 60)
    assert out.tokens == ar.tokens
    s = d.take_statistics()
    assert s["steps_dynamic"] + s["steps_static"] + s["steps_tree"] == len(out.accept_lengths)
    assert s["steps"] == s["steps_tree"]  # TR's own counts cover the steps that drafted its tree
    assert s["drafted_tree"] == 60 * s["steps_tree"]
    accepted = sum(out.accept_lengths) - len(out.accept_lengths)
    counted = s["accepted_dynamic"] + s["accepted_static"] + s["accepted_tree"]
    assert accepted <= counted <= accepted + 1  # the token budget may cut the last step's path short
    if static:
        assert s["accepted_static"] > 40 and s["steps_tree"] == 0
    else:  # this model falls into a loop that the dynamic automaton then drafts
        assert s["accepted_dynamic"] > 10 and s["steps_static"] == 0 and s["steps_tree"] > 0
    assert d.take_statistics()["steps_dynamic"] == 0  # taken means forgotten


@pytest.mark.parametrize("override,message", [
    ("method.len_threshold=0", r"method.len_threshold must be at least 1"),
    ("method.max_draft=0", r"method.max_draft must be at least 1"),
    ("method.len_bias=-1", r"method.len_bias must be 0 or more"),
    ("method.k=4", r"gives a node 7 children but the matrix keeps only k=4"),
    ("method.static_corpus=/nonexistent/store", r"REST datastore '/nonexistent/store' not found"),
])
def test_bad_settings_are_refused_in_one_line_before_loading(override, message, monkeypatch, capsys):
    code, err = run_in_process(["method=samd", override], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(message, lines[0]), lines[0]
    key, value = override.removeprefix("method.").split("=")
    if key != "static_corpus":  # and by the drafter itself, built from Python
        with pytest.raises(SettingsError, match=message):
            SAMDecoding(vocab_size=20, **{key: int(value)})

"""REST: suffix retrieval and trie building on hand-made data, the datastore on disk, and
equality with AR on the embedded model with the embedded datastore."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specbench.draft import DecodeState
from specbench.registry import build_drafter
from specbench.drafting.datastore import (SEPARATOR, Datastore, DatastoreError, build_datastore, build_trie, resolve_path)

DOCS = [
    [1, 2, 3, 4, 5, 6],
    [9, 2, 3, 4, 7, 8],
    [1, 2, 3, 4, 5, 9],
    [70000, 2, 3, 70001],  # ids above 65,535
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("rest") / "store"
    build_datastore(DOCS, path, vocab_size=80000, tokenizer="hand", corpus="hand-made")
    return Datastore(path)


def test_round_trip(store):
    toks = np.asarray(store.tokens)
    assert toks.dtype == np.uint32 and isinstance(store.tokens, np.memmap)
    expect = DOCS[0] + [SEPARATOR] + DOCS[1] + [SEPARATOR] + DOCS[2] + [SEPARATOR] + DOCS[3]
    assert toks.tolist() == expect
    # the suffix array sorts every suffix
    suffixes = [toks[i:].tolist() for i in store.sa]
    assert suffixes == sorted(suffixes)
    assert store.meta["vocab_size"] == 80000 and store.meta["max_token_id"] == 70001


def test_find_ranges(store):
    lo, hi = store.find([2, 3, 4])
    assert hi - lo == 3
    assert sorted(int(store.sa[i]) for i in range(lo, hi)) == [1, 8, 15]
    assert store.find([3, 4, 6]) [0] == store.find([3, 4, 6])[1]
    lo, hi = store.find([70000, 2])
    assert hi - lo == 1


def test_continuations_stop_at_document_end(store):
    lo, hi = store.find([3, 4])
    conts = store.continuations(lo, hi, 2, 4)
    assert sorted(map(tuple, conts.tolist())) == [(5, 6, -1, -1), (5, 9, -1, -1), (7, 8, -1, -1)]


def test_longest_suffix_wins(store):
    # "1 2 3 4" hits (docs 0 and 2), so doc 1's "... 2 3 4 -> 7 8" is not used
    prefixes, parents, span = store.search([0, 1, 2, 3, 4], max_span=16, min_span=2,
                                           continuation_len=3, num_draft=64)
    assert span == 4
    assert prefixes == [(5,), (5, 6), (5, 9)]
    assert parents == [0, 1, 1]
    # "8 2 3 4" has no hit with 4 tokens; "2 3 4" does, in three documents
    prefixes, parents, span = store.search([8, 2, 3, 4], continuation_len=2)
    assert span == 3
    assert prefixes[:2] == [(5,), (7,)] and set(prefixes[2:]) == {(5, 6), (5, 9), (7, 8)}
    # a large id works as a query
    assert store.search([70000, 2, 3])[0] == [(70001,)]
    # nothing of length >= 2 hits: no draft
    assert store.search([4, 4]) is None
    assert store.search([5]) is None  # shorter than min_span


def test_max_matches_limits_hits(store):
    prefixes, _, span = store.search([2, 3, 4], max_matches=1, continuation_len=2)
    assert span == 3 and len({p[0] for p in prefixes}) == 1


def test_trie_most_frequent_prefixes():
    conts = np.array([
        [1, 2, 3],
        [1, 2, 4],
        [1, 2, 4],
        [1, 5, -1],
        [6, 7, 8],
    ])
    prefixes, parents = build_trie(conts, 64, "all_prefixes")
    assert build_trie(conts, 64, "reference") == (prefixes, parents)  # depths add up to 14: nothing trimmed
    counts = {(1,): 4, (1, 2): 3, (6,): 1, (1, 2, 4): 2, (1, 5): 1, (6, 7): 1, (1, 2, 3): 1, (6, 7, 8): 1}
    assert set(prefixes) == set(counts)
    for i, (p, par) in enumerate(zip(prefixes, parents), start=1):  # parent-first, parent is p[:-1]
        assert par < i
        assert (par == 0 and len(p) == 1) or prefixes[par - 1] == p[:-1]
    # the top 4 by frequency (ties: shorter, then smaller tokens first), still a trie
    prefixes, parents = build_trie(conts, 4, "all_prefixes")
    assert prefixes == [(1,), (6,), (1, 2), (1, 2, 4)]
    assert parents == [0, 0, 1, 3]
    assert build_trie(np.full((2, 3), -1), 4) == ([], [])


def test_reference_trie_trims_longest_paths():
    """REST's cut_to_choices: the chosen prefixes are paths costing their distinct tokens; the
    costliest go first while the kept paths cost more than num_draft in all."""
    conts = np.array([[1, 2, 3, 4]] * 3 + [[1, 2, 5, -1]] + [[6, 7, -1, -1]] * 2)
    # prefixes (count, cost): 1 (4,1), 1 2 (4,2), 1 2 3 (3,3), 1 2 3 4 (3,4), 1 2 5 (1,3), 6 (2,1), 6 7 (2,2)
    full, _ = build_trie(conts, 8, "all_prefixes")
    assert len(full) == 7  # all of them: costs add up to 16
    # 16 > 8: drop 1 2 3 4 (-> 12), then of the cost-3 paths the less frequent 1 2 5 (-> 9), then 1 2 3 (-> 6)
    prefixes, parents = build_trie(conts, 8)
    assert prefixes == [(1,), (6,), (1, 2), (6, 7)] and parents == [0, 0, 1, 2]
    # a budget of 9 keeps 1 2 3: 1 + 2 + 3 + 1 + 2 = 9
    assert build_trie(conts, 9)[0] == [(1,), (6,), (1, 2), (6, 7), (1, 2, 3)]
    # the budget also caps the prefixes taken before trimming (the 7 most frequent of 7 here)
    assert build_trie(conts, 64)[0] == build_trie(conts, 64, "all_prefixes")[0]
    # num_draft 3: top 3 = 1, 1 2, 1 2 3 (costs 6) -> drop 1 2 3 -> 3
    assert build_trie(conts, 3)[0] == [(1,), (1, 2)]


def test_reference_trie_counts_distinct_tokens():
    """The reference costs a path by its set of tokens: a repeated token counts once, so a deep
    chain of one token costs 1 a node and is kept where the node depths add up to more than
    num_draft. Equal costs: the deeper path goes first."""
    conts = np.array([[3, 3, 3, 3]] * 5 + [[4, 5, 6, 7]])
    # costs: 3 / 3 3 / 3 3 3 / 3 3 3 3 -> 1 each; 4 -> 1, 4 5 -> 2, 4 5 6 -> 3, 4 5 6 7 -> 4; total 14
    prefixes, _ = build_trie(conts, 8)  # drop 4 5 6 7 (10), 4 5 6 (7)
    assert prefixes == [(3,), (4,), (3, 3), (4, 5), (3, 3, 3), (3, 3, 3, 3)]
    prefixes, _ = build_trie(conts, 3)  # top 3: 3, 3 3, 3 3 3 (cost 3): nothing to trim
    assert prefixes == [(3,), (3, 3), (3, 3, 3)]
    prefixes, _ = build_trie(conts, 8, "all_prefixes")
    assert len(prefixes) == 8
    # the top 5 (3-chain + 4) cost 5: nothing to trim
    assert build_trie(conts, 5)[0] == [(3,), (4,), (3, 3), (3, 3, 3), (3, 3, 3, 3)]
    # equal costs: the deeper path goes first, even when it is the more frequent
    conts = np.array([[3, 3, 4]] * 3 + [[3, 4, -1]] * 2)
    # 3 (5, cost 1), 3 3 (3, 1), 3 3 4 (3, 2), 3 4 (2, 2): total 6 > 4, drop 3 3 4
    assert build_trie(conts, 4)[0] == [(3,), (3, 3), (3, 4)]


def test_reference_trie_is_a_trimmed_trie():
    rng = np.random.default_rng(0)
    for _ in range(50):
        conts = rng.integers(0, 4, size=(int(rng.integers(1, 60)), 6))
        conts[rng.random(conts.shape) < 0.05] = -1
        conts[np.cumsum(conts == -1, axis=1) > 0] = -1
        for budget in (1, 5, 16, 64):
            full, _ = build_trie(conts, budget, "all_prefixes")
            ref, parents = build_trie(conts, budget)
            assert set(ref) <= set(full)
            for i, (p, par) in enumerate(zip(ref, parents), start=1):  # closed under prefixes
                assert (par == 0 and len(p) == 1) or (par < i and ref[par - 1] == p[:-1])
            cost = sum(len(set(p)) for p in ref)
            assert cost <= budget or len(ref) == 0
            # nothing more was trimmed than needed: the last path dropped (the cheapest dropped) did not fit
            if len(ref) < len(full):
                assert cost + min(len(set(p)) for p in set(full) - set(ref)) > budget
    with pytest.raises(ValueError, match="all_prefixes"):
        build_trie(np.array([[1]]), 4, "other")


def test_drafter_builds_a_tree(store):
    d = build_drafter("rest", vocab_size=80000, device="cpu", datastore=str(store.path), num_draft=3,
                      continuation_len=3, trie="all_prefixes")
    draft = d.propose(DecodeState(tokens=torch.tensor([0, 1, 2, 3, 4]), prompt_len=2, step=0))
    assert draft.tokens.tolist() == [5, 6, 9]
    assert draft.tree.parents == (0, 1, 1)
    # the reference trims 5 6 / 5 9 (costs 1 + 2 + 2 > 3): the less frequent-or-later path goes
    d = build_drafter("rest", vocab_size=80000, device="cpu", datastore=str(store.path), num_draft=3,
                      continuation_len=3)
    draft = d.propose(DecodeState(tokens=torch.tensor([0, 1, 2, 3, 4]), prompt_len=2, step=0))
    assert draft.tokens.tolist() == [5, 6] and draft.tree.parents == (0, 1)
    with pytest.raises(ValueError, match="method.trie"):
        build_drafter("rest", vocab_size=80000, device="cpu", datastore=str(store.path), trie="nope")
    assert d.propose(DecodeState(tokens=torch.tensor([4, 4]), prompt_len=1, step=0)) is None


def test_missing_and_corrupt_datastore(tmp_path, store):
    with pytest.raises(DatastoreError, match="not found.*build_rest_datastore"):
        Datastore(tmp_path / "nope")
    with pytest.raises(DatastoreError, match="not found"):
        build_drafter("rest", vocab_size=100, device="cpu", datastore=str(tmp_path / "nope"))
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(DatastoreError, match="missing meta.json, tokens.npy, sa.npy"):
        Datastore(bad)
    for f in ("meta.json", "tokens.npy", "sa.npy"):
        (bad / f).write_bytes((store.path / f).read_bytes())
    Datastore(bad)
    # truncated array
    (bad / "sa.npy").write_bytes((store.path / "sa.npy").read_bytes()[:-8])
    with pytest.raises(DatastoreError, match="corrupt"):
        Datastore(bad)
    # a suffix array that is not sorted
    np.save(bad / "sa.npy", np.asarray(store.sa)[::-1].copy())
    with pytest.raises(DatastoreError, match="not sorted"):
        Datastore(bad)
    # garbage metadata
    (bad / "meta.json").write_text("{not json")
    with pytest.raises(DatastoreError, match="meta.json"):
        Datastore(bad)
    (bad / "meta.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(DatastoreError, match="not a specbench-rest-datastore"):
        Datastore(bad)


def test_store_for_another_vocabulary_is_refused(store):
    with pytest.raises(DatastoreError, match="vocabulary"):
        build_drafter("rest", vocab_size=32000, device="cpu", datastore=str(store.path))


def test_build_script_round_trip(tmp_path):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "build_rest_datastore.py"
    spec = importlib.util.spec_from_file_location("build_rest_datastore", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat")
    (corpus / "b.jsonl").write_text(json.dumps({"data": ["hello world", "the cat sat"]}) + "\n"
                                    + json.dumps({"messages": [{"role": "user", "content": "a dog"}]}) + "\n")
    assert mod.texts_from_record({"conversations": [{"from": "gpt", "value": "x"}]}) == ["x"]

    class Tok:  # a character-level tokenizer with ids above 65,535
        def __len__(self):
            return 70000 + 256

        def __call__(self, text, add_special_tokens=False):
            return type("E", (), {"input_ids": [70000 + ord(c) for c in text]})()

    mod.load_tokenizer = lambda args: (Tok(), "chars")
    meta = mod.main([str(corpus), "--tokenizer", "chars", "--out", str(tmp_path / "st")])
    assert meta["n_docs"] == 4 and meta["max_token_id"] >= 70000
    ds = Datastore(tmp_path / "st")
    q = [70000 + ord(c) for c in "the cat "]
    prefixes, _, span = ds.search(q, continuation_len=3)
    assert span == 8 and (70000 + ord("s"),) in prefixes

    # gzipped jsonl (make_rest_corpus.py's records) and chatterbot-corpus' YAML layout
    import gzip

    chat = tmp_path / "chat"
    chat.mkdir()
    recs = [{"id": i, "source": "x", "messages": [{"role": "user", "content": f"q{i}"},
                                                  {"role": "assistant", "content": f"answer {i}"}]} for i in range(4)]
    with gzip.open(chat / "answers.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs))
    (chat / "talk.yml").write_text("categories:\n- x\nconversations:\n- - Hello\n  - Hi there\n- - Bye\n")
    assert mod.file_texts(chat / "talk.yml", False) == ["Hello\nHi there", "Bye"]
    meta = mod.main([str(chat / "answers.jsonl.gz"), str(chat / "talk.yml"), "--tokenizer", "chars",
                     "--out", str(tmp_path / "st2")])
    assert meta["n_docs"] == 8 + 2
    # --fraction keeps the first part of every source's records: 2 of 4 records (4 turns), 1 of 2 conversations
    meta = mod.main([str(chat / "answers.jsonl.gz"), str(chat / "talk.yml"), "--tokenizer", "chars",
                     "--fraction", "0.5", "--out", str(tmp_path / "st3")])
    assert meta["n_docs"] == 4 + 1 and meta["fraction"] == 0.5
    toks = np.asarray(Datastore(tmp_path / "st3").tokens)
    text = "".join(chr(t - 70000) if t != SEPARATOR else "|" for t in toks)
    assert text == "q0|answer 0|q1|answer 1|Hello\nHi there"
    # a document sharing an 8-word window with a benchmark prompt is dropped
    from specbench.inputs.tasks import MINI

    (chat / "bench.jsonl").write_text(json.dumps({"text": "x " + MINI[0].turns[0]}) + "\n"
                                      + json.dumps({"text": "nothing like a benchmark prompt"}) + "\n")
    meta = mod.main([str(chat / "bench.jsonl"), "--tokenizer", "chars", "--drop-benchmark-overlap",
                     "--out", str(tmp_path / "st4")])
    assert meta["n_docs"] == 1 and meta["dropped_for_benchmark_overlap"] == 1


def test_default_store_is_embedded():
    ds = Datastore(resolve_path("default"))
    assert ds.meta["tokenizer"] == "smollm2-135m" and len(ds) > 50_000
    assert resolve_path("default").name == "smollm2-135m-selfdistil"
    # the earlier store stays available by name
    assert Datastore(resolve_path("smollm2-135m-pydoc")).meta["tokenizer"] == "smollm2-135m"


def test_make_rest_corpus_self_distils_and_resumes(real_model, tmp_path):
    """make_rest_corpus.py: greedy answers of the model to the head trainers' prompts (tools/training_data.py), as chat
    records in selection order; a rerun only answers the prompts it lacks."""
    import gzip
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "make_rest_corpus.py"
    spec = importlib.util.spec_from_file_location("make_rest_corpus", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model, tok, _ = real_model
    mod.load_model = lambda cfg, device, dtype: (model, tok)
    out = tmp_path / "c.jsonl.gz"
    args = ["--out", str(out), "--max-new-tokens", "4", "--batch-size", "2", "--chunk", "2"]
    info = mod.main(args + ["--num-prompts", "3"])
    assert info["new_answers"] == 3 and 3 <= info["new_answer_tokens"] <= 12
    with gzip.open(out, "rt") as f:
        recs = [json.loads(ln) for ln in f]
    assert [r["id"] for r in recs] == [0, 1, 2]
    picked, _ = mod.select_prompts(3, 0)
    for r, p in zip(recs, picked):
        assert r["messages"][0] == {"role": "user", "content": p["text"]} and r["source"] == p["source"]
        assert r["messages"][1]["role"] == "assistant" and r["messages"][1]["content"]
    info = mod.main(args + ["--num-prompts", "4"])
    assert info["new_answers"] == 1 and info["prompts_answered"] == 4


def test_the_store_behind_a_setting_joins_the_resume_identity():
    """`datastore=default` names whatever store is embedded today: answers made with another store
    must not be resumed, so the store's name and size are part of the run's identity."""
    from specbench.methods.rest.drafter import Rest

    default = Rest.resource_identity({"datastore": "default"})
    pydoc = Rest.resource_identity({"datastore": "smollm2-135m-pydoc"})
    assert default["datastore"] == "smollm2-135m-selfdistil" and default != pydoc
    assert pydoc["datastore_tokens"] == 109935

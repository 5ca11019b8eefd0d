"""Suffix Decoding: the implicit suffix tree against an explicit one and against arctic-inference (where
installed), the drafter's protocol (a turn's output joins the global tree as it is generated, as in
arctic-inference and vLLM, or with running_in_global=false only once answered; reset forgets it), its settings refused before anything loads, and drafts accepted on repeated text."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specbench.decoding.engine import Engine
from specbench.draft import DecodeState, StepOutcome
from specbench.errors import SettingsError
from specbench.drafting import suffix_backends
from specbench.drafting.suffix_backends import arctic_problem
from specbench.methods.suffix.drafter import SuffixDecoding
from specbench.drafting.suffix_tree import SuffixTrees, match_groups, speculate, text_of
from specbench.registry import build_drafter

HAVE_ARCTIC = arctic_problem() is None
BACKENDS = ["python", pytest.param("arctic", marks=pytest.mark.skipif(
    not HAVE_ARCTIC, reason=f"arctic-inference does not import here ({arctic_problem()})"))]


def draft(seqs, context, depth=24, factor=1.0, offset=0.0, min_prob=0.1, use_tree=False):
    return speculate(text_of(seqs), np.array(context), max_depth=depth, max_tokens=depth, factor=factor,
                     offset=offset, min_prob=min_prob, use_tree=use_tree)


# -- the tree, on hand-made texts (the expected drafts are arctic-inference 0.3.0's) ----------------

def test_probabilities_are_continuation_frequencies_and_the_context_counts_itself():
    # "2 3" occurs twice, once at the end (continuing nowhere): "4" follows it with probability 1/2;
    # match length 2 allows 2 tokens (factor 1), and the longest-scoring match wins
    d = draft([[1, 2, 3, 4, 5, 1, 2, 3]], [1, 2, 3])
    assert (d.tokens, d.parents, d.probs, d.match_len) == ([4, 5], [-1, 0], [0.5, 0.5], 2)
    # in another text (the global tree) the same match continues with certainty
    d = draft([[1, 2, 3, 4, 5]], [1, 2, 3])
    assert (d.tokens, d.probs) == ([4, 5], [1.0, 1.0])


def test_draft_length_follows_the_match_length_and_the_tree_depth():
    # depth 4: a match of 1 leaves 3 tokens of depth, whatever the factor allows
    assert draft([[1, 2, 3, 4, 5, 6, 1, 2]], [1, 2], depth=4, factor=10).tokens == [3, 4, 5]
    # factor 0.5, offset 1: a 1-token match earns int(1.5) = 1 token, a 3-token match int(2.5) = 2
    assert draft([[9, 1, 2, 3, 4, 5]], [7, 2], factor=0.5, offset=1).tokens == [3]
    assert draft([[9, 1, 2, 3, 4, 5]], [7, 9, 1, 2], factor=0.5, offset=1).tokens == [3, 4]
    # depth 3: a 2-token match leaves 1 token of depth, a 1-token match 2, and scores more
    d = draft([[5, 6, 7, 8, 9]], [5, 6, 7], depth=3, factor=2)
    assert (d.tokens, d.match_len) == ([8, 9], 1)


def test_min_token_prob_cuts_the_path_where_its_probability_falls_below():
    # after "1 2": 3 three times, 4 once (probability 3/4); after "1 2 3": 8 twice, 9 once (then 1/2)
    seqs = [[1, 2, 3, 8], [1, 2, 3, 8], [1, 2, 3, 9], [1, 2, 4]]
    assert draft(seqs, [0, 1, 2], factor=2, min_prob=0.1).probs == pytest.approx([0.75, 0.5])
    assert draft(seqs, [0, 1, 2], factor=2, min_prob=0.6).tokens == [3]
    assert draft(seqs, [0, 1, 2], factor=2, min_prob=0.8).tokens == []


def test_tree_mode_drafts_the_likeliest_continuations_best_first():
    seq = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 5, 5, 9, 1, 2]
    d = draft([seq], [9, 1, 2], factor=4, use_tree=True)
    assert d.match_len == 2 and d.tokens == [3, 1, 2, 4, 5, 3, 4, 1]
    assert d.parents == [-1, 0, 1, -1, -1, 2, 2, 3]
    assert d.probs == pytest.approx([0.4, 0.4, 0.4, 0.2, 0.2, 0.2, 0.2, 0.2])
    # the path takes the most frequent branch, the one seen first among equals (3 before 4)
    assert draft([seq], [9, 1, 2], factor=4).tokens == [3, 1, 2, 3, 1, 2, 4, 1]


# -- the tree, on random texts, against an explicit depth-limited suffix tree -----------------------

def explicit_tree(seqs, depth):
    """Every string of up to `depth` tokens -> its occurrences (sequence, end position), in text order."""
    occ: dict[tuple, list] = {}
    for si, seq in enumerate(seqs):
        for i in range(len(seq)):
            for n in range(1, min(depth, len(seq) - i) + 1):
                occ.setdefault(tuple(seq[i:i + n]), []).append((si, i + n - 1))
    return {s: sorted(v) for s, v in occ.items()}


def explicit_draft(seqs, context, depth, factor, offset, min_prob, use_tree):
    """The module docstring's definition, by brute force: (tokens of the best path, or the sorted
    probabilities of the best tree; its score; its match length)."""
    occ = explicit_tree(seqs, depth)
    kids = lambda s: [(t[-1], len(occ[t]), occ[t][0]) for t in occ if len(t) == len(s) + 1 and t[:-1] == s]  # noqa: E731
    context = context[-depth:]
    best, by_length = ([], 0.0, 0), {}
    for m in range(1, len(context)):
        s = tuple(context[-m:])
        if s not in occ:
            break
        limit = max(0, min(depth, int(m * factor + offset + 1e-6)))
        if use_tree:  # every node under the match, its probability; the tree = the `limit` likeliest
            probs, frontier = [], [(s, 1.0)]
            while frontier:
                node, p = frontier.pop()
                for tok, count, _ in kids(node):
                    q = p * count / len(occ[node])
                    if q >= min_prob:
                        probs.append(q)
                        frontier.append((node + (tok,), q))
            found = sorted(probs, reverse=True)[:limit]
        else:
            found, node, p = [], s, 1.0
            while len(found) < min(limit, depth - m) and kids(node):
                tok, count, _ = min(kids(node), key=lambda k: (-k[1], k[2]))
                p *= count / len(occ[node])
                if p < min_prob:
                    break
                found.append((tok, p))
                node += (tok,)
        score = sum(found) if use_tree else sum(p for _, p in found)
        by_length[m] = (found if use_tree else [t for t, _ in found], score, m)
        if score >= best[1] - 1e-12:
            best = by_length[m]
    return best, by_length


@pytest.mark.parametrize("use_tree", [False, True])
def test_drafts_equal_the_explicit_tree_s_on_random_texts(use_tree):
    rng = random.Random(0)
    for _ in range(400):
        depth, vocab = rng.choice([3, 5, 8, 24]), rng.choice([2, 3, 6, 50])
        seqs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(1, 4))]
        context = [rng.randrange(vocab) for _ in range(rng.randrange(2, 12))]
        if rng.random() < 0.5:  # a context copied from the text: long matches, often of one occurrence
            seq = rng.choice(seqs)
            start = rng.randrange(len(seq))
            context = context[: rng.randrange(3)] + seq[start : start + rng.randrange(1, 26)]
        factor, offset, min_prob = rng.choice([0.5, 1.0, 3.0]), rng.choice([0.0, 1.0]), rng.choice([0.0, 0.15, 0.4])
        got = draft(seqs, context, depth, factor, offset, min_prob, use_tree)
        (want, score, m), by_length = explicit_draft(seqs, context, depth, factor, offset, min_prob, use_tree)
        assert got.score == pytest.approx(score)
        if got.tokens and got.match_len != m:  # scores equal but for rounding: either draft is the best
            want, tied, _ = by_length[got.match_len]
            assert tied == pytest.approx(score)
        if use_tree:  # the same probabilities (ties may pick other nodes), and each parent drafted first
            assert sorted(got.probs, reverse=True) == pytest.approx(want)
            assert all(-1 <= p < i for i, p in enumerate(got.parents))
        else:
            assert got.tokens == want and got.parents == list(range(-1, len(want) - 1))


def test_match_groups_cover_every_match_length_with_its_occurrences():
    rng = random.Random(5)
    for _ in range(300):
        vocab = rng.choice([2, 4, 40])
        text = text_of([[rng.randrange(vocab) for _ in range(rng.randrange(1, 80))] for _ in range(rng.randrange(1, 3))])
        context = np.array([rng.randrange(vocab) for _ in range(rng.randrange(1, 20))])
        max_len = rng.randrange(1, 25)
        want = {}  # m -> the end positions of the context's last m tokens, by brute force
        for m in range(1, min(max_len, len(context)) + 1):
            ends = [e for e in range(m - 1, len(text)) if list(text[e - m + 1 : e + 1]) == list(context[-m:])]
            if not ends:
                break
            want[m] = ends
        got, next_m = {}, 1
        for first, last, ends in match_groups(text, context, max_len):
            assert first == next_m and last >= first  # contiguous, in order
            got.update({m: ends.tolist() for m in range(first, last + 1)})
            next_m = last + 1
        assert got == want


@pytest.mark.skipif(not HAVE_ARCTIC, reason=f"arctic-inference does not import here ({arctic_problem()})")
def test_drafts_score_as_arctic_inference_s():
    """Tree drafts score alike whatever the ties; paths too except where equally frequent children
    lead on differently (1 case in 100 here), so paths are compared in the bulk."""
    from arctic_inference.suffix_decoding._C import SuffixTree

    rng = random.Random(1)
    same_path = 0
    for trial in range(300):
        depth, vocab = rng.choice([3, 5, 8, 24]), rng.choice([2, 3, 5, 20])
        seqs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 200))] for _ in range(rng.randrange(1, 4))]
        context = [rng.randrange(vocab) for _ in range(rng.randrange(2, 30))]
        factor, min_prob = rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 0.13, 0.37])  # off simple fractions
        tree = SuffixTree(depth)
        for i, s in enumerate(seqs):
            tree.extend(i, s)
        for use_tree in (False, True):
            theirs = tree.speculate(context[-depth:], depth, factor, 0.0, min_prob, use_tree)
            ours = draft(seqs, context, depth, factor, 0.0, min_prob, use_tree)
            if use_tree:
                assert ours.score == pytest.approx(theirs.score, rel=1e-5), (seqs, context)
            else:
                same_path += ours.tokens == list(theirs.token_ids)
    assert same_path >= 0.95 * 300


# -- the drafter's protocol ------------------------------------------------------------------------

def answer_turn(d, prompt, answer):
    """One turn through the drafter as the engine drives it: the prefill's token, then one step per
    further token (each emitted alone); returns the drafts proposed."""
    tokens, drafts = list(prompt) + answer[:1], []
    for step, tok in enumerate(answer[1:]):
        dr = d.propose(DecodeState(tokens=torch.tensor(tokens), prompt_len=len(prompt), step=step))
        drafts.append(None if dr is None else dr.tokens.tolist())
        d.observe(StepOutcome(draft=dr, root=tokens[-1], logits=torch.zeros(1, 100), accepted=[], bonus=tok,
                              emitted=[tok]))
        tokens.append(tok)
    return drafts


def next_draft(d, prompt, first):
    dr = d.propose(DecodeState(tokens=torch.tensor(list(prompt) + [first]), prompt_len=len(prompt), step=0))
    return None if dr is None else dr.tokens.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_answer_reaches_the_global_tree_once_answered_and_reset_forgets_it(backend):
    d = build_drafter("suffix", vocab_size=100, backend=backend, source_stats=True)
    answer = [60, 61, 62, 63, 64, 65, 66, 67]
    d.start_question()
    answer_turn(d, [1, 2, 3], answer)
    d.take_statistics()
    d.start_question()  # question 1 is answered
    # question 2 repeats question 1's opening: drafted from the global tree (no prompt token repeats)
    assert next_draft(d, [4, 5, 60, 61], 62) == [63, 64, 65]
    assert d.take_statistics()["drafts_from_global"] == 1
    d.reset()
    assert next_draft(d, [4, 5, 60, 61], 62) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_running_answer_enters_the_global_tree_as_it_is_generated(backend):
    """As arctic-inference and vLLM do: the running turn's output counts in the global tree at once."""
    d = build_drafter("suffix", vocab_size=100, backend=backend, source_stats=True)
    d.start_question()
    answer_turn(d, [1, 2, 3], [60, 61, 62, 63, 60, 61])
    if backend == "python":
        assert d._trees.global_text.tolist() == [60, 61, 62, 63, 60, 61, -1]
    # the prompt's "7 8 60 ..." continues differently in the turn's own tree (5 after 60 there)
    # than in the global tree, which holds the answer only (61 after 60, twice of twice)
    d.start_question()
    assert next_draft(d, [60, 5, 9, 9, 60], 61) == [62, 63]
    assert d.take_statistics()["drafts_from_global"] >= 1


@pytest.mark.skipif(not HAVE_ARCTIC, reason=f"arctic-inference does not import here ({arctic_problem()})")
def test_arctic_s_one_cache_drafts_what_the_source_telling_pair_drafts():
    """vLLM's one cache (source_stats=false, the default) against the pair that also says which tree drafted:
    the same draft every step over turns that repeat each other's answers; only the pair counts sources."""
    rng = random.Random(3)
    one, pair = (build_drafter("suffix", vocab_size=40, backend="arctic", source_stats=tell) for tell in (False, True))
    assert one._trees is None and pair._trees is None
    answers = [[rng.randrange(40) for _ in range(30)] for _ in range(3)]
    for turn in range(8):
        answer = answers[turn % 3][: 20 + turn] + [rng.randrange(40) for _ in range(6)]
        prompt = [rng.randrange(40) for _ in range(5)] + answers[(turn + 1) % 3][:8]
        one.start_question()
        pair.start_question()
        assert answer_turn(one, prompt, answer) == answer_turn(pair, prompt, answer)
    assert one._trees.own is None and pair._trees.own is not None
    stats_one, stats_pair = one.take_statistics(), pair.take_statistics()
    assert "drafts_from_global" not in stats_one and stats_pair["drafts_from_global"] > 0
    assert stats_one["drafted_steps"] == stats_pair["drafted_steps"] > 0
    assert stats_one["drafted_tokens"] == stats_pair["drafted_tokens"]


def test_running_answer_changes_the_global_tree_s_counts_and_probabilities():
    """The global tree's counts include the running answer's occurrences: with earlier answers
    "5 6 7" and "5 6 8", "5 6" continues with 7 at 1/2; once the running answer says "5 6 7" too,
    2/3. Without running_in_global (the earlier protocol) it stays 1/2 until the turn is answered."""
    for running, want in ((True, [2 / 3]), (False, [1 / 2])):
        trees = SuffixTrees(max_depth=24, max_cached=10, max_tokens=24, factor=1.0, offset=0.0, min_prob=0.1,
                            use_tree=False, running_in_global=running)
        for answer in ([5, 6, 7], [5, 6, 8]):
            trees.start_turn([0])
            trees.end_turn(answer)
        trees.start_turn([1])
        trees.extend([5, 6, 7, 9])
        spec = speculate(trees.global_text, np.array([3, 5, 6]), **trees.args)
        assert spec.tokens[:1] == [7] and spec.probs[:1] == pytest.approx(want)
        trees.end_turn([5, 6, 7, 9])
        assert [a.tolist() for a in trees.answers] == [[5, 6, 7], [5, 6, 8], [5, 6, 7, 9]]
        trees.start_turn([2])
        spec, source = trees.speculate(np.array([3, 5, 6]))
        assert source == "global" and spec.probs[:1] == pytest.approx([2 / 3])


def test_the_earlier_protocol_keeps_the_running_answer_out_until_answered():
    d = build_drafter("suffix", vocab_size=100, backend="python", running_in_global=False)
    d.start_question()
    answer_turn(d, [1, 2, 3], [60, 61, 62, 63, 60, 61])
    assert not d._trees.answers and d._trees.global_text.tolist() == [-1]
    assert d.take_statistics()["drafts_from_global"] == 0
    next_draft(d, [1, 2, 3, 60, 61, 62, 63, 60, 61, 7], 8)  # turn 2 of the question starts
    assert [a.tolist() for a in d._trees.answers] == [[60, 61, 62, 63, 60, 61]]


def test_max_cached_requests_evicts_the_oldest_answer_and_counts_the_running_turn():
    trees = SuffixTrees(max_depth=24, max_cached=2, max_tokens=24, factor=1.0, offset=0.0, min_prob=0.1,
                        use_tree=False)
    for answer in ([10, 11, 12], [20, 21, 22], [30, 31, 32]):
        trees.start_turn([0])
        trees.end_turn(answer)
    trees.start_turn([0])  # the running turn holds one of the two places, as a vLLM request does
    assert [a.tolist() for a in trees.answers] == [[30, 31, 32]]
    assert trees.speculate(np.array([5, 30, 31]))[0].tokens == [32]
    assert trees.speculate(np.array([5, 20, 21]))[0].tokens == []
    assert trees.global_text.tolist() == [30, 31, 32, -1]
    trees.extend([40, 41])  # the running answer, after the kept one
    assert trees.global_text.tolist() == [30, 31, 32, -1, 40, 41, -1]
    for _ in range(40):  # evictions move the buffer's start; compaction keeps the text whole
        trees.end_turn([40, 41])
        trees.start_turn([0])
        trees.extend([42])
        assert trees.global_text.tolist() == [40, 41, -1, 42, -1]


# -- settings --------------------------------------------------------------------------------------

TARGET = {"model_name": "smollm2-135m", "device": "cpu", "dtype_name": "float32"}


@pytest.mark.parametrize("params,message", [
    ({"max_tree_depth": 1}, r"max_tree_depth must be at least 2"),
    ({"max_spec_factor": -1.0}, r"max_spec_factor must be at least 0"),
    ({"max_spec_factor": 0.0}, r"no match of up to 23 tokens earns a drafted token"),
    ({"min_token_prob": 1.5}, r"min_token_prob must lie in \[0, 1\], got 1.5"),
    ({"max_cached_requests": -1}, r"max_cached_requests must be at least 0 \(0: no global tree\)"),
    ({"backend": "gpu"}, r"method.backend must be one of auto, arctic, python, got 'gpu'"),
    ({"use_tree": "yes"}, r"method.use_tree must be true or false"),
])
def test_bad_settings_are_refused_before_anything_loads(params, message):
    with pytest.raises(SettingsError, match=message):
        SuffixDecoding.check_settings(params, TARGET)


def test_arctic_asked_for_but_missing_is_refused_in_one_line_naming_the_install(monkeypatch, capsys):
    from tests.test_bad_inputs import run_in_process

    monkeypatch.setattr(suffix_backends, "arctic_problem", lambda: "No module named 'arctic_inference'")
    code, err = run_in_process(["method=suffix", "method.backend=arctic"], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert 'pip install -e ".[suffix]"' in lines[0] and "No module named 'arctic_inference'" in lines[0]


def test_auto_falls_back_to_our_trees_with_one_warning(monkeypatch, capsys):
    monkeypatch.setattr(suffix_backends, "arctic_problem", lambda: "No module named 'arctic_inference'")
    d = build_drafter("suffix", vocab_size=100)
    err = capsys.readouterr().err.strip().splitlines()
    assert d.backend == "python" and len(err) == 1 and err[0].startswith("warning: ")
    assert 'pip install -e ".[suffix]"' in err[0]
    assert SuffixDecoding.resource_identity({"backend": "auto"}) == {"suffix_backend": "python"}


# -- on the real model -----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_text_is_drafted_and_accepted(backend, real_model, ar_tokens):
    """A passage to copy: drafted from the prompt's tree; the same question again: from the global
    tree, which holds the first answer; both equal AR's tokens."""
    from specbench.inputs.chat import prompt_ids

    model, tok, eos = real_model
    text = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm windowsill."
    ids = prompt_ids(tok, [{"role": "user", "content": f"Repeat this sentence exactly, twice: {text}"}])
    d = build_drafter("suffix", vocab_size=model.get_output_embeddings().weight.shape[0], backend=backend,
                      source_stats=True)
    engine, n = Engine(model, eos), 32
    mats, stats = [], []
    for _ in range(2):
        d.start_question()
        out = engine.generate(ids, d, n)
        assert out.tokens == ar_tokens(ids, n)
        mats.append(sum(out.accept_lengths) / len(out.accept_lengths))
        stats.append(d.take_statistics())
    assert stats[0]["accepted_from_request"] > 0 and mats[0] > 1.5, (mats, stats)
    assert stats[1]["accepted_from_global"] > 0 and mats[1] > mats[0], (mats, stats)

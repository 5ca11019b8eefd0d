"""Suffix Decoding's suffix trees (arXiv 2411.04975), kept implicit, and the drafts they give.

A string s continues with t with probability count(s t) / count(s). Each step matches the context's
last m tokens (m < `max_depth`) and drafts from every match its likeliest continuation (a path, or a
best-first tree with `use_tree`), at most `factor` x m + `offset` tokens above `min_prob`; the draft
with the largest sum of probabilities wins. The tree is implicit: a node is the array of positions
where its string ends in the text, so appending a token costs nothing. Counts, probabilities and
drafts follow arctic-inference (vLLM's `method: suffix`) except for ties between equally frequent
children and probabilities exactly at min_prob. `SuffixTrees` holds the request's tree and the global
one. Details: docs/suffix-decoding.md.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import accumulate
from dataclasses import dataclass, field

import numpy as np

SEP = -1  # after every sequence of a text: no token equals it, so no match or draft crosses it


@dataclass
class Speculation:
    """A draft: tokens, each one's parent as an index into `tokens` (-1: the root, the context's last
    token), each one's estimated probability, and the match length it came from."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_len: int = 0

    @property
    def score(self) -> float:
        """Expected number of accepted tokens, if the estimates were right."""
        return float(sum(self.probs))


def text_of(sequences) -> np.ndarray:
    """Sequences end to end, each followed by SEP: the text a tree indexes."""
    parts = []
    for seq in sequences:
        parts += [np.asarray(seq, dtype=np.int64), np.array([SEP])]
    return np.concatenate(parts) if parts else np.array([SEP])


def match_groups(text: np.ndarray, context: np.ndarray, max_len: int):
    """Yield (first, last, ends) for the lengths m = first .. last (from 1 up to `max_len`, while the
    context's last m tokens occur in `text`) whose occurrences are one set: `ends`, their end positions,
    ascending. Each length filters the last one's occurrences (one comparison over the text, then over
    the hits); once one is left, its longest match is read in one comparison (`longest_match`)."""
    n = min(max_len, len(context))
    if n < 1:
        return
    ends = np.flatnonzero(text == context[-1])
    first = m = 1
    while ends.size > 1 and m < n:
        longer = ends[ends >= m]
        longer = longer[text[longer - m] == context[-1 - m]]
        if longer.size < ends.size:  # as many occurrences: the same ones
            yield first, m, ends
            first = m + 1
        ends, m = longer, m + 1
    if ends.size:
        yield first, (longest_match(text, context, int(ends[0]), m, n) if ends.size == 1 else m), ends


def longest_match(text: np.ndarray, context: np.ndarray, end: int, m: int, max_len: int) -> int:
    """How many of the context's last tokens end at text position `end`, known to be at least m, at
    most `max_len`: the text read backwards from `end` against the context read backwards."""
    n = min(max_len, len(context), end + 1)
    if n <= m:
        return m
    differ = np.flatnonzero(text[end - n + 1 : end + 1][::-1] != context[len(context) - n :][::-1])
    return int(differ[0]) if differ.size else n


SMALL = 64  # up to this many occurrences a Python count beats numpy's fixed costs


def children(text: np.ndarray, ends: np.ndarray, min_count: int = 1,
             best_only: bool = False) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The children of the node whose string ends at `ends` (ascending): (the token after each end,
    [(token, count)] for counts of at least `min_count`, or only the largest with `best_only`), most
    frequent first, ties to the one seen first."""
    after = text[ends + 1]
    if ends.size <= SMALL:
        counts: dict[int, int] = {}
        for tok in after.tolist():
            if tok != SEP:
                counts[tok] = counts.get(tok, 0) + 1
        kids = list(counts.items())  # in the order first seen
    else:  # a frequent string (a short match in a long text): count by token id, not by sorting
        counts = np.bincount(after[after != SEP])
        if counts.size == 0:
            return after, []
        keep = np.flatnonzero(counts >= (counts.max() if best_only else min_count))
        tokens, first = np.unique(after[np.isin(after, keep)], return_index=True)
        kids = [(int(t), int(counts[t])) for t in tokens[np.argsort(first)]]
    if best_only and kids:
        top = max(c for _, c in kids)
        kids = [kc for kc in kids if kc[1] == top]
    kids = [kc for kc in kids if kc[1] >= min_count]
    kids.sort(key=lambda kc: -kc[1])  # stable: equal counts keep the order first seen
    return after, kids


def follow_path(text: np.ndarray, ends: np.ndarray, limit: int, min_prob: float) -> Speculation:
    """The most frequent child, then its most frequent child, ..: at most `limit` tokens, each with
    probability at least `min_prob`."""
    spec, prob = Speculation(), 1.0
    while len(spec.tokens) < limit:
        if ends.size == 1:  # one occurrence left: the text after it, every step certain
            start, drafted = int(ends[0]) + 1, len(spec.tokens)
            rest = text[start : start + limit - drafted].tolist()
            if SEP in rest:
                rest = rest[: rest.index(SEP)]
            spec.parents += range(drafted - 1, drafted - 1 + len(rest))
            spec.tokens += rest
            spec.probs += [prob] * len(rest)
            break
        after, kids = children(text, ends, best_only=True)
        if not kids:
            break
        tok, count = kids[0]
        prob *= count / ends.size
        if prob < min_prob:
            break
        spec.parents.append(len(spec.tokens) - 1)
        spec.tokens.append(tok)
        spec.probs.append(prob)
        ends = ends[after == tok] + 1
    return spec


def best_first(text: np.ndarray, ends: np.ndarray, need: int, min_prob: float, max_depth: int,
               shallow: int) -> tuple[list[int], list[int], list[float], list[int]]:
    """The continuations of the node whose string ends at `ends`, likeliest first (a child is never
    likelier than its parent, so every node's parent comes before it), none below `min_prob` or deeper
    than `max_depth`, until `need` of them lie at most `shallow` deep: (tokens, parents as indices into
    them, -1 the root; probabilities; depths). Equal probabilities: first found, first."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    depths: list[int] = []
    heap: list = []
    pushed = shallow_found = 0

    def push_children(node_ends: np.ndarray, prob: float, parent: int, depth: int) -> None:
        nonlocal pushed
        if depth >= max_depth:
            return
        # a lenient bound on the count that keeps min_prob (the exact test is below)
        after, kids = children(text, node_ends, max(1, int(min_prob * node_ends.size / prob * (1 - 1e-9))))
        for tok, count in kids:
            p = prob * count / node_ends.size
            if p < min_prob:
                break  # counts descend: the rest are less likely still
            heapq.heappush(heap, (-p, pushed, tok, node_ends[after == tok] + 1, parent, depth + 1))
            pushed += 1

    push_children(ends, 1.0, -1, 0)
    while heap and shallow_found < need:
        neg_p, _, tok, node_ends, parent, depth = heapq.heappop(heap)
        tokens.append(tok)
        parents.append(parent)
        probs.append(-neg_p)
        depths.append(depth)
        shallow_found += depth <= shallow
        push_children(node_ends, -neg_p, len(tokens) - 1, depth)
    return tokens, parents, probs, depths


def take(order: tuple[list[int], list[int], list[float], list[int]], limit: int, max_depth: int) -> Speculation:
    """The first `limit` nodes of a `best_first` order at most `max_depth` deep, as a tree: what
    `best_first` would have drafted with that depth (a shallow node's rank among the shallow ones is
    the same whatever deeper nodes came between)."""
    spec, place = Speculation(), {-1: -1}
    for i, (tok, par, prob, depth) in enumerate(zip(*order)):
        if len(spec.tokens) >= limit:
            break
        if depth <= max_depth:
            place[i] = len(spec.tokens)
            spec.tokens.append(tok)
            spec.parents.append(place[par])
            spec.probs.append(prob)
    return spec


def speculate(text: np.ndarray, context: np.ndarray, *, max_depth: int, max_tokens: int, factor: float,
              offset: float, min_prob: float, use_tree: bool) -> Speculation:
    """The best-scoring draft over every match length of the context's tail (module docstring); of equal
    scores, the longest match's. A match takes m of the depth and earns factor x m + offset tokens; the
    lengths with one set of occurrences (`match_groups`) share one search of their continuations."""
    context = np.asarray(context)[-max_depth:]
    best, best_score, best_at = Speculation(), 0.0, None
    for first, last, ends in match_groups(text, context, len(context) - 1):
        lengths = range(first, last + 1)
        limits = [max(0, min(max_tokens, int(m * factor + offset + 1e-6))) for m in lengths]
        if use_tree:
            order = best_first(text, ends, max(limits), min_prob, max_depth - first, max_depth - last)
            if not order[0]:  # nothing follows (the context's own end): every length drafts nothing
                if best.score <= 0:
                    best = Speculation(match_len=last)
                continue
            for m, limit in zip(lengths, limits):
                spec = take(order, limit, max_depth - m)
                if spec.score >= best.score:
                    spec.match_len = m
                    best = spec
            continue
        path = follow_path(text, ends, max_depth - first, min_prob)
        if not path.tokens:  # as above
            if best_score <= 0:
                best_at = (last, 0, path)
            continue
        sums = list(accumulate(path.probs, initial=0.0))  # a prefix's score, summed as `score` sums
        for m, limit in zip(lengths, limits):
            k = min(limit, max_depth - m)
            if sums[min(k, len(path.probs))] >= best_score:
                best_at, best_score = (m, k, path), sums[min(k, len(path.probs))]
    if use_tree or best_at is None:
        return best
    m, k, path = best_at
    return Speculation(path.tokens[:k], path.parents[:k], path.probs[:k], m)


class SuffixTrees:
    """The current turn's tree (its prompt and output so far) and the global tree of answers.

    As in arctic-inference's SuffixDecodingCache (what vLLM's `method: suffix` calls), a turn
    reserves its place in the global tree when it starts, so the global tree holds at most
    `max_cached - 1` earlier answers while a turn runs, and (`running_in_global`, the default) the
    turn's output joins the global tree as it is generated: its occurrences count there too,
    changing the global tree's counts, probabilities and scores. With `running_in_global=False`
    (this harness before issue 47, kept for comparison) an answer enters the global tree only when
    `end_turn` is called, after the turn is answered.

    The global text is one buffer: answers end to end, each followed by SEP, the running answer
    last; evicting the oldest answer moves the buffer's start, appending writes in place."""

    def __init__(self, max_depth: int, max_cached: int, max_tokens: int, factor: float, offset: float,
                 min_prob: float, use_tree: bool, running_in_global: bool = True):
        self.max_cached = max_cached
        self.running_in_global = bool(running_in_global) and max_cached > 0
        self.args = dict(max_depth=max_depth, max_tokens=max_tokens, factor=factor, offset=offset,
                         min_prob=min_prob, use_tree=use_tree)
        self.answers: deque = deque()  # answered turns, oldest first (arrays)
        # the global text: buffer[start:end] then SEP (the buffer is SEP beyond `end`)
        self._global = np.full(1, SEP, dtype=np.int64)
        self._global_start = self._global_end = 0
        # the turn's prompt and output, then SEP: a buffer that doubles when full, so a step's
        # tokens are written in place and the text is a view
        self._turn = np.full(1, SEP, dtype=np.int64)
        self._turn_len = 0
        self._running = 0  # tokens of the running answer already in the global text

    @staticmethod
    def _append(buf: np.ndarray, end: int, tokens: np.ndarray) -> np.ndarray:
        """`buf` with `tokens` written at `end` (grown, SEP-filled, when they do not fit with a SEP)."""
        stop = end + tokens.size
        if stop + 1 > buf.size:
            grown = np.full(max(2 * buf.size, stop + 1), SEP, dtype=np.int64)
            grown[:end] = buf[:end]
            buf = grown
        buf[end:stop] = tokens
        return buf

    def _add_global(self, tokens: np.ndarray, close: bool = False) -> None:
        """Append to the global text (`close`: then a SEP, ending the sequence)."""
        if self._global_start > self._global.size // 2:  # evicted answers fill half: compact
            live = self._global[self._global_start : self._global_end].copy()
            self._global[:] = SEP
            self._global[: live.size] = live
            self._global_start, self._global_end = 0, live.size
        self._global = self._append(self._global, self._global_end, tokens)
        self._global_end += tokens.size + (1 if close else 0)

    def start_turn(self, prompt) -> None:
        self._turn_len = 0
        self._turn[:] = SEP
        self._running = 0
        self.extend(prompt, prompt=True)
        while self.max_cached and len(self.answers) > self.max_cached - 1:
            oldest = self.answers.popleft()
            self._global[self._global_start : self._global_start + oldest.size + 1] = SEP
            self._global_start += oldest.size + 1

    def extend(self, tokens, prompt: bool = False) -> None:
        """Tokens of the running turn: the prompt's (`prompt`), or its output's, which with
        `running_in_global` join the global text at once."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self._turn = self._append(self._turn, self._turn_len, tokens)
        self._turn_len += tokens.size
        if self.running_in_global and not prompt:
            self._add_global(tokens)
            self._running += tokens.size

    def end_turn(self, response) -> None:
        if self.max_cached:
            answer = np.asarray(response, dtype=np.int64).reshape(-1)
            # running_in_global: the output is in the global text already, as generated (the same
            # tokens as `response` when the caller extended them all): written again, then closed
            self._global_end -= self._running
            self._global[self._global_end : self._global_end + self._running] = SEP
            self.answers.append(answer)
            self._add_global(answer, close=True)
        self._running = 0
        self._turn_len = 0
        self._turn[:] = SEP

    @property
    def turn_tokens(self) -> np.ndarray:
        """The running turn's prompt and output so far (a view)."""
        return self._turn[: self._turn_len]

    @property
    def global_text(self) -> np.ndarray:
        """The global tree's text: earlier answers and (running_in_global) the running one."""
        start, end = self._global_start, self._global_end
        closed = end > start and self._global[end - 1] == SEP  # the last answer ends with its SEP
        return self._global[start : end if closed else end + 1]

    def speculate(self, context) -> tuple[Speculation, str]:
        """The better of the two trees' drafts and where it came from ("request" or "global"); the
        request's own wins ties (as in arctic-inference)."""
        own = speculate(self._turn[: self._turn_len + 1], context, **self.args)
        if self._global_end == self._global_start:
            return own, "request"
        past = speculate(self.global_text, context, **self.args)
        return (own, "request") if own.score >= past.score else (past, "global")

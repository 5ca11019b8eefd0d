"""A suffix automaton over token ids: the index behind SAM-Decoding (specbench/methods/samd.py).

Built online (Blumer et al., 1985; amortised O(1) per appended token), so the automaton of a prompt
and its output grows with every accepted token and is never rebuilt. Drafting needs
`step(match, token)`, the longest suffix of query + token that occurs in the text, and
`continuation(state, n)`, the n tokens after the first occurrence of a state's strings; `follow` and
`feed` keep a query's match up to date against a fixed corpus or the growing text itself. Plain
Python lists and dicts. The construction and the invariants: docs/samd.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

SEPARATOR = -1  # between documents: no query contains it, so no match spans two documents


class Match(NamedTuple):
    """The longest suffix of a query found in the text: its state and its length (0: none)."""

    state: int = 0
    length: int = 0


class SuffixAutomaton:
    def __init__(self, tokens: Iterable[int] = ()):
        # State s: transitions next[s], suffix link link[s] (-1 for the initial state 0, the empty
        # string), length[s] of its longest string, first_end[s] = how many tokens of the text lie
        # up to the end of that string's first occurrence, i.e. where its continuation starts.
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [0]
        self.tokens: list[int] = []
        self.last = 0  # the state of the whole text
        self.extend(tokens)

    @classmethod
    def from_documents(cls, documents: Iterable[Iterable[int]]) -> "SuffixAutomaton":
        sam = cls()
        for i, doc in enumerate(documents):
            if i:
                sam.append(SEPARATOR)
            sam.extend(doc)
        return sam

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_states(self) -> int:
        return len(self.next)

    def _state(self, length: int, link: int, first_end: int, transitions: dict[int, int]) -> int:
        self.next.append(transitions)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.next) - 1

    def append(self, token: int) -> None:
        self.tokens.append(token)
        n = len(self.tokens)
        cur = self._state(n, 0, n, {})
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                # q's strings up to length[p] + 1 now also end at n, its longer ones do not: split
                # the shorter ones off into a clone, which inherits q's first occurrence.
                clone = self._state(self.length[p] + 1, self.link[q], self.first_end[q], dict(self.next[q]))
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def extend(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.append(int(t))

    def step(self, match: Match, token: int) -> Match:
        state, length = match
        while state and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        nxt = self.next[state].get(token)
        return Match() if nxt is None else Match(nxt, length + 1)

    def settle(self, match: Match) -> Match:
        """The same string's state after appends: an append may have split its state, the string
        then belonging to the clone, which alone receives the transitions added afterwards."""
        state, length = match
        while state and self.length[self.link[state]] >= length:
            state = self.link[state]
        return Match(state, length)

    def with_room(self, state: int, n: int) -> int:
        """`state`, or the nearest of its suffix-link ancestors (shorter matches, first occurring no
        later) whose first occurrence is followed by at least n tokens; never the empty match."""
        while self.link[state] > 0 and len(self.tokens) - self.first_end[state] < n:
            state = self.link[state]
        return state

    def continuation(self, state: int, n: int) -> list[int]:
        """Up to n tokens after the first occurrence of the state's strings, cut at a document's end."""
        start = self.first_end[state]
        out = self.tokens[start : start + n]
        return out[: out.index(SEPARATOR)] if SEPARATOR in out else out


def follow(sam: SuffixAutomaton, match: Match, tokens: Iterable[int]) -> Match:
    """The longest suffix of query + tokens found in `sam`'s (fixed) text, from the query's match."""
    for t in tokens:
        match = sam.step(match, int(t))
    return match


def feed(sam: SuffixAutomaton, match: Match, tokens: Iterable[int]) -> Match:
    """Append tokens to `sam`'s own text, keeping the longest suffix of the text that also occurs
    ending earlier in it. Stepping that match with one more token gives the longest suffix of
    text + token found in the text, whose continuation is the draft."""
    for t in tokens:
        t = int(t)
        match = sam.step(match, t)  # against the text before t: an occurrence that ends earlier
        sam.append(t)
        match = sam.settle(match)
    return match

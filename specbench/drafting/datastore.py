"""REST's datastore: the token ids of a corpus and their suffix array, memory-mapped.

A datastore is a directory: `tokens.npy` (uint32 ids, so any vocabulary up to 2**32 - 1; documents
separated by SEPARATOR = 2**32 - 1), `sa.npy` (its suffix array by pydivsufsort, int32, int64 past
2**31 tokens) and `meta.json` (format version, vocabulary size, token count, corpus description,
and the tokenizer the ids belong to: `model` and `vocab_sha256`, see `check_tokenizer`). Both arrays
are opened with `np.load(mmap_mode="r")`: a lookup touches only the pages its binary search visits.
`Datastore.search` is REST's retrieval: the longest suffix of the context (max_span down to
min_span tokens) with a hit, up to `max_matches` hits, `continuation_len` tokens after each, and the
`num_draft` most frequent continuation prefixes as a trie, trimmed as REST's DraftRetriever does
(trie="reference", see `build_trie`) or kept whole (trie="all_prefixes").
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Iterable

import numpy as np

from specbench.errors import SettingsError, SpecbenchError

FORMAT = "specbench-rest-datastore"
VERSION = 1
SEPARATOR = np.iinfo(np.uint32).max  # between documents; sorts after every real token
DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "rest"
DEFAULT_NAME = "smollm2-135m-selfdistil"
TRIE_RULES = ("reference", "all_prefixes")


class DatastoreError(SpecbenchError, RuntimeError):
    """A datastore that is missing, incomplete or corrupt."""


def _hint(path: Path) -> str:
    return (f"rebuild it with: python scripts/build_rest_datastore.py --model <model> --out {path} "
            f"<corpus files or --dataset NAME>")


def require_divsufsort():
    """pydivsufsort's suffix sort; only building a store needs it (reading one does not)."""
    try:
        from pydivsufsort import divsufsort
    except ImportError:
        raise DatastoreError("building a REST datastore needs the pydivsufsort package: pip install "
                             "pydivsufsort (or carry its wheel); the stores under data/rest/ need no build") from None
    return divsufsort


def vocab_sha256(tokenizer) -> str:
    """A hash of the tokenizer's vocabulary (token -> id, added tokens included): two tokenizers
    with the same hash give the same ids, whatever their models are called. "" when the tokenizer
    cannot list its vocabulary."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return ""
    items = sorted(get_vocab().items())
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def build_datastore(docs: Iterable[list[int]], out: str | Path, *, vocab_size: int,
                    tokenizer: str = "", corpus: str = "", extra_meta: dict | None = None,
                    model: str = "", vocab_hash: str = "") -> dict:
    """Write a datastore from token-id documents. Returns its metadata. `model` (the model config's
    name) and `vocab_hash` (`vocab_sha256` of the tokenizer) say which tokenizer the ids belong to."""
    divsufsort = require_divsufsort()

    out = Path(out)
    parts: list[np.ndarray] = []
    n_docs = 0
    sep = np.array([SEPARATOR], dtype=np.uint32)
    for doc in docs:
        arr = np.asarray(doc, dtype=np.int64)
        if arr.size == 0:
            continue
        if arr.min() < 0 or arr.max() >= min(vocab_size, SEPARATOR):
            raise ValueError(f"document {n_docs}: token ids must lie in [0, {vocab_size}), "
                             f"got {arr.min()}..{arr.max()}")
        if parts:
            parts.append(sep)
        parts.append(arr.astype(np.uint32))
        n_docs += 1
    if not parts:
        raise ValueError("the corpus produced no tokens; give non-empty text files or a dataset")
    tokens = np.concatenate(parts)
    sa = divsufsort(tokens, force64=len(tokens) >= 2**31 - 1)
    sa = sa.astype(np.int32 if len(tokens) < 2**31 - 1 else np.int64, copy=False)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "tokens.npy", tokens)
    np.save(out / "sa.npy", sa)
    meta = {"format": FORMAT, "version": VERSION, "tokenizer": tokenizer,
            **({"model": model} if model else {}), **({"vocab_sha256": vocab_hash} if vocab_hash else {}),
            "vocab_size": int(vocab_size), "n_tokens": int(len(tokens)), "n_docs": n_docs,
            "max_token_id": int(tokens[tokens != SEPARATOR].max()), "separator": int(SEPARATOR), "corpus": corpus,
            **(extra_meta or {})}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def resolve_path(path: str | Path | None) -> Path:
    """`default` (or None) is the embedded store for the embedded SmolLM2; a bare name is looked
    up under data/rest/; anything else is a path."""
    if path in (None, "", "default"):
        return DATA_DIR / DEFAULT_NAME
    p = Path(path)
    if not p.exists() and (DATA_DIR / str(path)).exists():
        return DATA_DIR / str(path)
    return p


def open_datastore(path: Path) -> tuple[dict, np.ndarray, np.ndarray]:
    """Check a datastore's files and metadata and map its arrays (nothing is read but the headers):
    (meta, tokens, suffix array). A missing, incomplete or inconsistent store raises DatastoreError."""
    if not path.is_dir():
        raise DatastoreError(f"REST datastore '{path}' not found (expected a directory with "
                             f"tokens.npy, sa.npy and meta.json); {_hint(path)}")
    missing = [f for f in ("meta.json", "tokens.npy", "sa.npy") if not (path / f).is_file()]
    if missing:
        raise DatastoreError(f"REST datastore '{path}' is incomplete: missing {', '.join(missing)}; {_hint(path)}")
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise DatastoreError(f"REST datastore '{path}': meta.json is unreadable ({e}); {_hint(path)}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DatastoreError(f"REST datastore '{path}': meta.json is not a {FORMAT} file; {_hint(path)}")
    if meta.get("version") != VERSION:
        raise DatastoreError(f"REST datastore '{path}' has format version {meta.get('version')}, "
                             f"this code reads version {VERSION}; {_hint(path)}")
    try:
        tokens = np.load(path / "tokens.npy", mmap_mode="r")
        sa = np.load(path / "sa.npy", mmap_mode="r")
    except (OSError, ValueError, EOFError) as e:
        raise DatastoreError(f"REST datastore '{path}' is corrupt: {e}; {_hint(path)}") from None
    n = meta.get("n_tokens")
    if (tokens.dtype != np.uint32 or tokens.ndim != 1 or sa.ndim != 1
            or sa.dtype not in (np.int32, np.int64) or len(tokens) != n or len(sa) != n):
        raise DatastoreError(
            f"REST datastore '{path}' is corrupt: tokens {tokens.dtype}{list(tokens.shape)}, "
            f"suffix array {sa.dtype}{list(sa.shape)}, meta says {n} tokens; {_hint(path)}")
    return meta, tokens, sa


def store_model(meta: dict) -> str | None:
    """The model config a store was built for: `model`, or in stores written before it existed the
    `tokenizer` field when that names a conf/model config (build_rest_datastore.py --model wrote the
    name there; --tokenizer wrote a path, which names no model)."""
    from specbench.inputs.models import MODEL_CONFIGS

    if meta.get("model"):
        return str(meta["model"])
    name = str(meta.get("tokenizer") or "")
    return name if name and "/" not in name and (MODEL_CONFIGS / f"{name}.yaml").is_file() else None


def check_tokenizer(path: Path, meta: dict, model_name: str, vocab_hash: str = "", *,
                    before_loading: bool = False) -> None:
    """Refuse a store built for another tokenizer (SettingsError, one line). The vocabulary hashes
    decide when both are known (a store built for vicuna-7b serves vicuna-13b: same tokenizer);
    else the model names do. Before the model is loaded its tokenizer is unknown, so a store with a
    hash waits for it rather than refuse a model of another name that shares the tokenizer. A store
    that records neither is left to the vocabulary-size check."""
    built_hash, built_model = meta.get("vocab_sha256"), store_model(meta)
    if built_hash and vocab_hash:
        if built_hash == vocab_hash:
            return
        why = f"whose tokenizer differs (vocabulary sha256 {vocab_hash[:12]}, the store's {built_hash[:12]})"
    elif built_hash and before_loading:
        return
    elif built_model and model_name and built_model != model_name:
        why = "whose token ids need not be the store's"
    else:
        return
    from specbench.inputs.models import MODEL_CONFIGS

    source = (f"--model {model_name}" if model_name and (MODEL_CONFIGS / f"{model_name}.yaml").is_file()
              else "--tokenizer <the model's directory or hub id>")
    raise SettingsError(
        f"REST datastore '{path}' was built for model '{built_model or meta.get('tokenizer')}', but this run's "
        f"model is '{model_name}', {why}; build a store for it: python scripts/build_rest_datastore.py "
        f"{source} <corpus files> --out <dir>, then pass method.datastore=<dir>")


class Datastore:
    def __init__(self, path: str | Path, check: bool = True):
        self.path = Path(path)
        self.meta, self.tokens, self.sa = open_datastore(self.path)
        if check:
            self._check_sample()
        self.vocab_size = int(self.meta["vocab_size"])

    def _check_sample(self, k: int = 256) -> None:
        """Cheap sanity check: sampled suffix-array entries are in range and in order."""
        n = len(self.sa)
        if n < 2:
            return
        idx = np.unique(np.linspace(0, n - 2, num=min(k, n - 1)).astype(np.int64))
        a, b = np.asarray(self.sa[idx]), np.asarray(self.sa[idx + 1])
        bad = (a < 0) | (a >= n) | (b < 0) | (b >= n)
        if not bad.any():
            for x, y in zip(a.tolist(), b.tolist()):
                if self.tokens[x:x + 32].tolist() > self.tokens[y:y + 32].tolist():
                    bad = True
                    break
        if np.any(bad):
            raise DatastoreError(f"REST datastore '{self.path}' is corrupt: its suffix array is not "
                                 f"sorted or points outside the token array; {_hint(self.path)}")

    def __len__(self) -> int:
        return len(self.tokens)

    def find(self, query: list[int]) -> tuple[int, int]:
        """[lo, hi) range of suffix-array rows whose suffix starts with `query`."""
        m = len(query)
        tokens, sa = self.tokens, self.sa
        key = lambda i: tokens[sa[i]:sa[i] + m].tolist()  # noqa: E731
        rows = range(len(sa))
        lo = bisect_left(rows, query, key=key)
        if lo == len(sa) or key(lo) != query:
            return lo, lo
        return lo, bisect_right(rows, query, lo=lo, key=key)

    def continuations(self, lo: int, hi: int, offset: int, length: int) -> np.ndarray:
        """(hi - lo, length) int64: the `length` tokens after each hit (`offset` = query length),
        -1 past the end of the corpus or from a document separator on."""
        starts = np.asarray(self.sa[lo:hi], dtype=np.int64) + offset
        idx = starts[:, None] + np.arange(length)[None]
        inside = idx < len(self.tokens)
        out = np.asarray(self.tokens[np.minimum(idx, len(self.tokens) - 1)]).astype(np.int64)
        out[~inside] = -1
        out[out == SEPARATOR] = -1
        out[np.cumsum(out == -1, axis=1) > 0] = -1  # nothing after a cut
        return out

    def search(self, context: list[int], *, max_span: int = 16, min_span: int = 2,
               max_matches: int = 5000, continuation_len: int = 10, num_draft: int = 64,
               trie: str = "reference"):
        """REST's retrieval. Returns (prefixes, parents, span): the trie's nodes in parent-first
        order as token tuples, each node's parent (0 = root, i = the i-th node), and the query
        length that hit; or None when no suffix of length >= min_span hits. `trie` is the rule
        of `build_trie`."""
        for span in range(min(max_span, len(context)), min_span - 1, -1):
            query = [int(t) for t in context[-span:]]
            lo, hi = self.find(query)
            if hi > lo:
                conts = self.continuations(lo, min(hi, lo + max_matches), span, continuation_len)
                trie = build_trie(conts, num_draft, trie)
                return (*trie, span) if trie[0] else None
        return None


def build_trie(conts: np.ndarray, num_draft: int, rule: str = "reference") -> tuple[list[tuple[int, ...]], list[int]]:
    """REST's draft trie from the rows of `conts` (continuations, -1 = padding).

    Both rules first take the `num_draft` most frequent prefixes of the rows. Ties go to the
    shorter, then the lexicographically smaller prefix, so every chosen prefix's own prefixes are
    chosen too (a prefix is at least as frequent as its extensions).

    rule="all_prefixes" verifies all of them (up to num_draft nodes a step).

    rule="reference" then trims them as REST's DraftRetriever does (`cut_to_choices` in
    DraftRetriever/src/lib.rs, FasterDecoding/REST): every chosen prefix is a path whose cost is
    its number of distinct tokens (the path length unless a token repeats); paths are dropped in
    order of decreasing cost while the costs of all kept paths add up to more than num_draft.
    The tree is the kept paths (and their prefixes, which are kept too). Since a node's cost is
    about its depth, the node depths of the kept trie add up to at most num_draft: about 25 nodes
    a step instead of 64. The reference breaks ties between equal costs in hash-set order (not
    reproducible); here a deeper path goes first, then the less frequent one, then the
    lexicographically larger one, which keeps the trie closed under prefixes.

    Returns the prefixes in parent-first order (by length, then frequency) and their parents
    (0 = root, i = the i-th prefix, 1-based)."""
    if rule not in TRIE_RULES:
        raise ValueError(f"unknown REST trie rule '{rule}'; valid: {', '.join(TRIE_RULES)}")
    if conts.size == 0 or num_draft < 1:
        return [], []
    m, width = conts.shape
    rows = conts[np.lexsort(conts.T[::-1])]  # lexicographic row order
    # first column where row i differs from row i-1 (width if equal); row 0 starts every group
    neq = rows[1:] != rows[:-1]
    first_diff = np.concatenate([[0], np.where(neq.any(1), neq.argmax(1), width)])
    counts, depths, starts = [], [], []
    for d in range(width):
        s = np.flatnonzero(first_diff <= d)
        c = np.diff(np.append(s, m))
        ok = rows[s, d] >= 0
        counts.append(c[ok]), depths.append(np.full(ok.sum(), d)), starts.append(s[ok])
    counts, depths, starts = map(np.concatenate, (counts, depths, starts))
    if counts.size == 0:
        return [], []
    top = np.lexsort((starts, depths, -counts))[:num_draft]  # best first
    if rule == "reference":
        top = _trim_to_budget(rows, starts, depths, top, num_draft)
    order = top[np.lexsort((-counts[top], depths[top]))]  # parent-first: by depth, then frequency
    prefixes: list[tuple[int, ...]] = []
    parents: list[int] = []
    node_of: dict[tuple[int, ...], int] = {}
    for j in order.tolist():
        p = tuple(rows[starts[j], : depths[j] + 1].tolist())
        parents.append(node_of[p[:-1]] if len(p) > 1 else 0)
        prefixes.append(p)
        node_of[p] = len(prefixes)
    return prefixes, parents


def _trim_to_budget(rows: np.ndarray, starts: np.ndarray, depths: np.ndarray, top: np.ndarray,
                    num_draft: int) -> np.ndarray:
    """REST's `cut_to_choices`: the chosen prefixes `top` (best first) less the costliest paths, a
    path's cost its number of distinct tokens, until the kept paths' costs add up to num_draft."""
    cost = np.array([len(set(rows[starts[j], : depths[j] + 1].tolist())) for j in top.tolist()])
    rank = np.arange(len(top))
    drop_order = np.lexsort((-rank, -depths[top], -cost))  # costliest, deepest, least frequent first
    total = int(cost.sum())
    keep = np.ones(len(top), dtype=bool)
    for i in drop_order.tolist():
        if total <= num_draft:
            break
        total -= int(cost[i])
        keep[i] = False
    return top[keep]

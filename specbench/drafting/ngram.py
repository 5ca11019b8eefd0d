"""N-gram matching over the decided tokens: Prompt Lookup's search (apoorvumang/prompt-lookup-decoding,
as Spec-Bench runs it), used by `pld` and by `tr_fused`'s chain.

The query is the last n tokens of prompt + output (n = max_ngram_size down to 1); the earliest
earlier occurrence whose following num_pred_tokens tokens all lie inside the sequence wins.
With `kernel` (a CPU target whose drafter found our CPU kernels built: `kernel_ready`) our kernel scans
for the first hit (decoding/ngram_search.cpp); else numpy does: for each n, n shifted equality tests over
the sequence, then the first hit. The same match either way.

Example: in [5, 6, 7, 8, 5, 6] the query [5, 6] (n = 2) first occurs at 0, so with
num_pred_tokens = 2 the match is ([7, 8], 2).
"""

from __future__ import annotations

import torch

from specbench.errors import SettingsError
from specbench.decoding.packed_linear import host_kernels


def check_ngram(max_ngram_size: int, num_pred_tokens: int) -> None:
    """The search's bounds, as `method.max_ngram_size` and `method.num_pred_tokens` name them."""
    if max_ngram_size < 1 or num_pred_tokens < 1:
        raise SettingsError(f"PLD needs method.max_ngram_size >= 1 and method.num_pred_tokens >= 1, "
                            f"got {max_ngram_size} and {num_pred_tokens}")


def find_candidate(seq: torch.Tensor, max_ngram_size: int = 3, num_pred_tokens: int = 10,
                   kernel: bool = False) -> torch.Tensor | None:
    """The reference `find_candidate_pred_tokens` on a 1-D sequence, or None when nothing matches."""
    match = find_match(seq, max_ngram_size, num_pred_tokens, kernel)
    return None if match is None else match[0]


def find_match(seq: torch.Tensor, max_ngram_size: int = 3, num_pred_tokens: int = 10,
               kernel: bool = False) -> tuple[torch.Tensor, int] | None:
    """(the tokens that followed the match, a view of `seq`; the matched n-gram's size n), or None.

    As in the reference (and Spec-Bench), a window at index i qualifies when
    i + n + num_pred_tokens <= len(seq) and i + n < len(seq) - n (not the query itself). `seq` is a
    CPU tensor (DecodeState's); without our kernel the tests run in numpy over a view of it, whose calls
    cost a fraction of torch's on arrays this small."""
    if kernel and seq.dtype == torch.long:
        start, n = host_kernels().find_ngram(seq, max_ngram_size, num_pred_tokens)
        return None if n == 0 else (seq[start : start + num_pred_tokens], n)
    ids = seq.numpy()
    length = ids.size
    for n in range(min(max_ngram_size, length - 1), 0, -1):
        last = min(length - n - num_pred_tokens, length - 2 * n - 1)  # last admissible window
        if last < 0:
            continue
        hit = ids[: last + 1] == ids[length - n]
        for j in range(1, n):
            hit &= ids[j : last + 1 + j] == ids[length - n + j]
        idx = int(hit.argmax())
        if hit[idx]:
            start = idx + n
            return seq[start : start + num_pred_tokens], n
    return None

"""What Token Recycling keeps of a verified row of logits: its top k and, for the probabilities of
those k, the row's log-normaliser (log of the sum of exp over the vocabulary).

On an x86-64 CPU with AVX2 our kernel (decoding/row_summary.cpp, built with the packed matrix kernel as
one extension, decoding/packed_linear.py) reads each row once, where torch's topk and logsumexp each take
a pass of their own; elsewhere (another device, a CPU without AVX2, a build that failed, or
`SPECBENCH_TR_KERNELS=torch`) torch's ops give the same top-k values and, but for exact ties, the same
indices. The kernel's normaliser agrees with torch's to a few float32 rounding steps (its own exp).
A failed build costs nothing but speed: torch's ops, and one `warning:` line a run (none of its own
where the forward's choice has said why the kernel does not run). On the kernel's path a step's rows go
into the matrix in one call (`write_rows`, same file: summary, matrix, probabilities). `kernel_ready` also
decides for TR's other CPU kernel, its template's expansion (decoding/tree_expansion.cpp, drafting/recycling.py).
"""

from __future__ import annotations

import functools
import os
import sys
from collections import namedtuple

import torch

from specbench.decoding.packed_linear import host_kernels
from specbench.decoding.transfers import on_host

RowSummary = namedtuple("RowSummary", "values indices log_norm")  # log_norm: (rows, 1) float32, or None
TopK = namedtuple("TopK", "values indices")
# `torch`: torch's (and numpy's) ops for TR's row summary and expansion even where our kernels build
# (side-by-side timing: scripts/bench_drafting.py --tr-kernels kernel,torch)
ENV = "SPECBENCH_TR_KERNELS"


def top_k_rows(logits: torch.Tensor, k: int, block: int = 64) -> TopK:
    """`logits.topk(k, dim=-1)` of a 2-D tensor in torch's ops: the same values and, but for exact
    ties, the same indices, several times faster on a CPU. Each row's top k lie in the k blocks with
    the largest maxima: were an element of the top k outside them, those k maxima would all be at least
    as large. So: block maxima, their top k, then the top k of those blocks' elements. Static shapes
    throughout; other devices, or a vocabulary not a multiple of `block`, take torch's topk."""
    rows, vocab = logits.shape
    if logits.device.type != "cpu" or vocab % block or vocab // block < k:
        return TopK(*logits.topk(k, dim=-1))
    blocks = logits.reshape(rows, vocab // block, block)  # a view when the rows are contiguous
    chosen = blocks.amax(dim=-1).topk(k, dim=-1).indices  # (rows, k) block numbers
    cand = blocks.gather(1, chosen[..., None].expand(rows, k, block)).reshape(rows, k * block)
    best = cand.topk(k, dim=-1)
    where = chosen.gather(1, best.indices // block) * block + best.indices % block
    return TopK(best.values, where)


@functools.cache
def kernel_ready() -> bool:
    """Whether TR's rows are summarised, and its template expanded, by our kernels in this process (built
    here at the first call: call it before anything is timed). A build that fails says so in one line, once."""
    if os.environ.get(ENV, "").lower() == "torch":
        return False
    from specbench.decoding import packed_linear

    if not packed_linear.available():
        return False  # not an AVX2 machine: torch's ops, as intended, nothing to warn about
    problem = packed_linear.build_problem()
    if problem:
        if not packed_linear.problem_said():  # the forward's choice may have said it already: one line a run
            packed_linear.note_problem_said()
            print(f"warning: TR's row summary and template expansion run on torch's and numpy's ops: our kernel "
                  f"does not build here "
                  f"({problem})", file=sys.stderr)
        return False
    return True


def row_summary(logits: torch.Tensor, k: int, normaliser: bool = True) -> RowSummary:
    """The top k of each row of a 2-D tensor (values descending, as float32 on the kernel's path) and,
    with `normaliser`, each row's logsumexp as a (rows, 1) float32 column."""
    # on_host, not the device's type: while a SyncAudit has the CPU stand in for an accelerator, its ops run
    if on_host(logits.device) and logits.shape[-1] >= k and kernel_ready():
        x = logits if logits.dtype == torch.float32 else logits.float()
        values, indices, log_norm = host_kernels().row_summary(x, k, normaliser)
        return RowSummary(values, indices, log_norm[:, None] if normaliser else None)
    top = top_k_rows(logits, k)
    if not normaliser:
        return RowSummary(top.values, top.indices, None)
    if logits.device.type == "cpu":  # log_softmax takes about half of logsumexp's time on a CPU
        first = torch.log_softmax(logits.float(), dim=-1).gather(1, top.indices[:, :1])
        return RowSummary(top.values, top.indices, top.values[:, :1].float() - first)
    return RowSummary(top.values, top.indices, torch.logsumexp(logits.float(), dim=-1, keepdim=True))


def probabilities(summary: RowSummary) -> torch.Tensor:
    """softmax(row) at the row's top k: exp(logit - log-normaliser), float32."""
    return (summary.values.float() - summary.log_norm).exp()

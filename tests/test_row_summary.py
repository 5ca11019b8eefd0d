"""TR's row summary (drafting/row_summary.py): the top k of each verified row and its log-normaliser,
on our kernel and on torch's ops."""

import pytest
import torch

from specbench.drafting import row_summary as rs
from specbench.drafting.recycling import Recycling, RecyclingSettings
from specbench.drafting.row_summary import probabilities, row_summary, top_k_rows


@pytest.fixture
def torch_ops(monkeypatch):
    """The torch path, as on a machine without the kernel."""
    monkeypatch.setenv(rs.ENV, "torch")
    rs.kernel_ready.cache_clear()
    yield
    monkeypatch.delenv(rs.ENV)
    rs.kernel_ready.cache_clear()


def reference(x: torch.Tensor, k: int):
    ref = x.topk(k, dim=-1)
    lse = torch.logsumexp(x.double(), dim=-1, keepdim=True)
    return ref, (ref.values.double() - lse).exp()


@pytest.mark.parametrize("rows,vocab,k", [(1, 49152, 8), (7, 49152, 8), (3, 50257, 8), (2, 1000, 5), (4, 97, 8),
                                          (2, 40, 8), (1, 8, 8), (1, 64, 64)])
def test_the_kernel_gives_torchs_top_k_and_softmax(packed_kernel, rows, vocab, k):
    """Values and indices are torch's topk's (no ties in random floats), whatever the vocabulary's size
    against the kernel's blocks of 64 (a short last block, fewer blocks than k, one block); the
    probabilities are the softmax's within the kernel's exp (3e-6 relative, row_summary.cpp)."""
    assert rs.kernel_ready()
    g = torch.Generator().manual_seed(rows * vocab + k)
    x = torch.randn(rows, vocab, generator=g) * 4
    x[0, -1] = 50.0  # a winner in the last (possibly short) block
    ours = row_summary(x, k)
    ref, p = reference(x, k)
    assert ours.values.dtype == torch.float32 and ours.indices.dtype == torch.long
    assert torch.equal(ours.values, ref.values) and torch.equal(ours.indices, ref.indices)
    assert ours.log_norm.shape == (rows, 1)
    torch.testing.assert_close(probabilities(ours).double(), p, rtol=3e-6, atol=1e-12)
    bare = row_summary(x, k, normaliser=False)
    assert bare.log_norm is None and torch.equal(bare.indices, ours.indices)


def test_the_kernel_breaks_ties_by_the_lower_index_and_ignores_masked_tokens(packed_kernel):
    """Equal logits come lowest index first; -inf logits (tokens a model masks) add nothing to the
    normaliser and never displace a finite one."""
    x = torch.full((2, 300), -float("inf"))
    x[0, [5, 70, 131, 200]] = 3.0
    x[0, [6, 250]] = 1.0
    x[1, :] = 0.5
    ours = row_summary(x, 4)
    assert ours.indices[0].tolist() == [5, 70, 131, 200] and ours.indices[1].tolist() == [0, 1, 2, 3]
    p = probabilities(ours)
    torch.testing.assert_close(p[0], torch.full((4,), torch.e ** 3 / (4 * torch.e ** 3 + 2 * torch.e)))
    torch.testing.assert_close(p[1], torch.full((4,), 1 / 300))


def test_half_precision_rows_are_summarised_as_their_float32_values(packed_kernel):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 49152, generator=g) * 3).to(torch.bfloat16)
    ours, ref = row_summary(x, 8), x.float().topk(8, dim=-1)
    assert torch.equal(ours.values, ref.values)
    assert torch.equal(x.float().gather(1, ours.indices), ours.values)


def test_the_torch_path_gives_the_same_summary(torch_ops):
    """Where the kernel is not used (SPECBENCH_TR_KERNELS=torch, or it does not build), torch's ops
    give the same top k and the probabilities within their rounding."""
    assert not rs.kernel_ready()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 49152, generator=g) * 4
    ours = row_summary(x, 8)
    ref, p = reference(x, 8)
    assert torch.equal(ours.values, ref.values) and torch.equal(ours.indices, ref.indices)
    # torch's float32 log_softmax over 49,152 logits: within about 1e-5 (the kernel's: 3e-6)
    torch.testing.assert_close(probabilities(ours).double(), p, rtol=3e-5, atol=1e-12)


def test_a_failed_build_leaves_torchs_ops_and_one_warning(monkeypatch, capsys):
    from specbench.decoding import packed_linear

    monkeypatch.setattr(packed_linear, "available", lambda: True)
    monkeypatch.setattr(packed_linear, "build_problem", lambda: "no compiler here")
    monkeypatch.setattr(packed_linear, "_said", [False])
    rs.kernel_ready.cache_clear()
    try:
        x = torch.randn(2, 500)
        ours = row_summary(x, 3)
        row_summary(x, 3)
        assert torch.equal(ours.indices, x.topk(3, dim=-1).indices)
        err = capsys.readouterr().err
        assert err.count("warning: TR's row summary and template expansion run on torch's") == 1 and "no compiler here" in err
        # where the forward's choice has said why the kernel does not run, the run gets no second line
        packed_linear._said[0] = True
        rs.kernel_ready.cache_clear()
        assert torch.equal(row_summary(x, 3).indices, ours.indices)
        assert capsys.readouterr().err == ""
    finally:
        rs.kernel_ready.cache_clear()


def test_the_matrix_learns_the_same_rows_on_either_path(packed_kernel, monkeypatch):
    """A matrix written through the kernel holds the same candidates as one written through torch's
    ops, and their probabilities within rounding."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(9, 3000, generator=g) * 4
    tokens = torch.tensor([3, 17, 3, 99, 5, 17, 2000, 8, 1])  # repeats: the last row of a token wins
    written = []
    for path in ("kernel", "torch"):
        if path == "torch":
            monkeypatch.setenv(rs.ENV, "torch")
        rs.kernel_ready.cache_clear()
        assert rs.kernel_ready() == (path == "kernel")
        r = Recycling(RecyclingSettings(), 3000, "cpu", confidences=True)
        r.write(tokens, logits)
        written.append((r.matrix.clone(), r.probs.clone(), r.written.clone()))
    monkeypatch.delenv(rs.ENV)
    rs.kernel_ready.cache_clear()
    (m1, p1, w1), (m2, p2, w2) = written
    assert torch.equal(m1, m2) and torch.equal(w1, w2)
    torch.testing.assert_close(p1, p2, rtol=2e-6, atol=1e-9)
    assert m1[3].tolist() == logits[2].topk(8).indices.tolist()

@pytest.mark.parametrize("drafted", [None, [17, 3, 99, 5, 17, 3, 8]])
@pytest.mark.parametrize("temperature", [None, 0.7])
def test_a_step_written_in_one_call_is_the_rows_written_one_by_one(packed_kernel, drafted, temperature):
    """`observe` on the kernel's one call (`write_rows`) leaves the matrix, `written`, the probabilities and
    the coupling tables exactly as the step's rows written through `_write_host`, duplicates included
    (the root's token drafted again, a token drafted twice: the last row wins)."""
    from specbench.draft import Draft, DraftTree, StepOutcome

    g = torch.Generator().manual_seed(3)
    vocab = 3000
    draft = None if drafted is None else Draft(tokens=torch.tensor(drafted), tree=DraftTree((0,) * len(drafted)))
    logits = torch.randn(1 + len(drafted or []), vocab, generator=g) * 4
    outcome = StepOutcome(draft=draft, root=3, logits=logits, accepted=[], bonus=0, emitted=[0])
    kept = []
    for one_call in (True, False):
        r = Recycling(RecyclingSettings(), vocab, "cpu", confidences=True)
        if temperature is not None:
            r.couple(temperature)
        r.write(torch.tensor([5, 6]), torch.randn(2, vocab, generator=torch.Generator().manual_seed(1)))
        if one_call:
            r._write_step(outcome)
        else:
            r._write_host(*r._host_rows(outcome))
        kept.append([r.matrix, r.written, r.probs, *([] if r.tables is None else map(torch.from_numpy, r.tables))])
    for ours, theirs in zip(*kept):
        assert torch.equal(ours, theirs)
    token, row = (3, 0) if drafted is None else (17, 5)
    assert kept[0][0][token].tolist() == logits[row].topk(8).indices.tolist()


@pytest.mark.parametrize("rows,vocab", [(1, 49152), (6, 49152), (81, 49152), (3, 32000), (2, 50257), (4, 256)])
def test_top_k_rows_is_torchs_topk(rows, vocab):
    """The blockwise top-k gives torch's values and indices (no ties in random floats); a vocabulary
    that is not a multiple of the block, or too small for k blocks, takes torch's own."""
    g = torch.Generator().manual_seed(rows * vocab)
    x = torch.randn(rows, vocab, generator=g) * 4
    x[0, -1] = 50.0  # a winner in the last block
    ours, ref = top_k_rows(x, 8), x.topk(8, dim=-1)
    assert torch.equal(ours.values, ref.values) and torch.equal(ours.indices, ref.indices)


def test_top_k_rows_in_bfloat16_keeps_the_top_values_among_ties():
    """Half-precision logits tie often: the values are torch's, and each index holds its value."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 49152, generator=g) * 3).to(torch.bfloat16)
    ours, ref = top_k_rows(x, 8), x.topk(8, dim=-1)
    assert torch.equal(ours.values, ref.values)
    assert torch.equal(x.gather(1, ours.indices), ours.values)
    assert all(len(set(r)) == 8 for r in ours.indices.tolist())


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_the_kernels_coupling_tables_are_numpys_within_rounding(packed_kernel, monkeypatch, temperature):
    """The coupling tables our kernel makes (and `write_rows` refreshes) against numpy's: the same -log(p) / T
    and log tail bound within float32 rounding, and the same infinities and NaNs where rows hold zeros
    (unwritten rows; a row whose k candidates hold all its mass)."""
    import numpy as np

    from specbench.drafting.recycling import coupling_tables

    g = torch.Generator().manual_seed(11)
    p = torch.softmax(torch.randn(40, 50, generator=g) * 3, dim=-1).topk(8).values
    p[0] = 0.0  # never written
    p[1, 5:] = 0.0  # a candidate with no mass
    p[2] = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.03125, 0.03125, 0.0, 0.0])  # all the mass
    probs = p.numpy()
    rs.kernel_ready.cache_clear()
    ours = coupling_tables(probs, temperature)
    monkeypatch.setenv(rs.ENV, "torch")
    rs.kernel_ready.cache_clear()
    try:
        theirs = coupling_tables(probs, temperature)
    finally:
        monkeypatch.delenv(rs.ENV)
        rs.kernel_ready.cache_clear()
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
        # 1 - sum(p) loses digits to cancellation, whichever order sums p: 1e-5 of the log's value
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # equal NaNs and infinities by default

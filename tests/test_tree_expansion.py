"""TR's template expanded from its matrix on our CPU kernel (decoding/tree_expansion.cpp) against the
numpy expansions beside it in drafting/recycling.py: the same tokens, the same confidences (coupled: to
the last float32 bits of two exp implementations)."""

import numpy as np
import pytest
import torch

from specbench.drafting import row_summary as rs
from specbench.drafting.recycling import Recycling, RecyclingSettings

TREE = [[4], [3, 2, 1, 1], [2, 1, 0, 1, 0, 0, 1], [1, 1, 0, 0, 1]]


def filled(vocab=500, k=6, seed=0, temperature=None) -> Recycling:
    """A matrix with random candidates and probabilities, its first 50 rows never written."""
    r = Recycling(RecyclingSettings(k=k, tree=TREE), vocab, "cpu", confidences=True)
    g = torch.Generator().manual_seed(seed)
    r.matrix.copy_(torch.randint(0, vocab, (vocab, k), generator=g, dtype=torch.int32))
    p = torch.rand(vocab, k, generator=g)
    p = (p / p.sum(1, keepdim=True) * 0.9).sort(dim=1, descending=True).values
    p[:50] = 0
    r.matrix[:50] = 0
    r.probs.copy_(p)
    if temperature is not None:
        r.couple(temperature)
    return r


def both_ways(monkeypatch, expand):
    """expand() on our kernel, then on numpy's gathers (SPECBENCH_TR_KERNELS=torch)."""
    rs.kernel_ready.cache_clear()
    assert rs.kernel_ready()
    ours = expand()
    monkeypatch.setenv(rs.ENV, "torch")
    rs.kernel_ready.cache_clear()
    try:
        theirs = expand()
    finally:
        monkeypatch.delenv(rs.ENV)
        rs.kernel_ready.cache_clear()
    return ours, theirs


@pytest.mark.parametrize("confidences", [True, False])
def test_the_kernel_expands_as_numpy_does(packed_kernel, monkeypatch, confidences):
    r = filled()
    for root in (0, 7, 49, 50, 123, 499):  # unwritten rows expand to token 0 with confidence 0
        (t1, c1), (t2, c2) = both_ways(monkeypatch, lambda: r.expand(root, confidences))
        assert torch.equal(t1, t2) and t1[0] == root and t1.dtype == torch.long
        assert (c1 is None and c2 is None) if not confidences else torch.equal(c1, c2)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_the_kernel_couples_as_numpy_does(packed_kernel, monkeypatch, temperature):
    r = filled(temperature=temperature)
    rng = np.random.default_rng(1)
    for root in range(0, 500, 23):
        noise = [rng.gumbel(size=500).astype(np.float32) for _ in range(r.template.max_depth)]
        (t1, c1), (t2, c2) = both_ways(monkeypatch, lambda: r.expand_coupled(root, noise, temperature))
        assert torch.equal(t1, t2)
        assert torch.allclose(c1, c2, rtol=1e-6, atol=0)  # std::exp and numpy's exp may differ in the last bit
        assert c1[0] == 1 and (c1 >= 0).all() and (c1 <= 1).all()


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_keyed_noise_couples_as_its_drawn_rows_do(packed_kernel, temperature):
    """The sampler's noise read entry by entry in the kernel (`expand_coupled_keyed`) orders every
    parent's candidates as the rows drawn whole over the vocabulary do: the same tokens and confidences."""
    from specbench.decoding.sampling import PositionSampler

    r = filled(temperature=temperature)
    sampler = PositionSampler(temperature, seed=4)
    sampler.bind("q", 2)
    assert sampler.keyed()
    for root in range(0, 500, 17):
        noise = sampler.keyed_noise([10 * root + d for d in range(r.template.max_depth)])
        t1, c1 = r.expand_coupled(root, noise, temperature)
        t2, c2 = r.expand_coupled(root, noise.rows(500), temperature)
        assert torch.equal(t1, t2) and torch.equal(c1, c2)


def test_the_kernel_refuses_a_tree_out_of_order(packed_kernel):
    r = filled()
    parents, rank, _ = r.host_nodes
    with pytest.raises(RuntimeError, match="follow its parent"):
        torch.ops.specbench.expand_template(r.matrix, r.probs, parents.flip(0).contiguous(), rank, 3)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        torch.ops.specbench.expand_template(r.matrix, None, parents, rank, 500)

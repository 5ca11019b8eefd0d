"""Our packed matrix kernel (specbench/decoding/packed_linear.py): the products it computes, the
independence of each row from the rows beside it, and the model twin that uses it."""

import pytest
import torch
from torch import nn


from specbench.decoding.packed_linear import PackedLinear, pack_weight, with_packed_linears

pytestmark = pytest.mark.usefixtures("packed_kernel")  # skipped, with the reason, where it cannot build


def test_pack_weight_layout():
    w = torch.arange(14 * 3, dtype=torch.float32).view(14, 3)  # 14 outputs: 3 panels, the last 4 padded
    p = pack_weight(w)
    assert p.shape == (3, 3, 6)
    for n in range(14):
        assert torch.equal(p[n // 6, :, n % 6], w[n])
    assert not p[2, :, 2:].any()


@pytest.mark.parametrize("n,k,bias", [(1003, 576, True), (6, 7, False), (97, 32, False), (13, 1, True)])
def test_products_equal_torch(n, k, bias):
    torch.manual_seed(n + k)
    lin = nn.Linear(k, n, bias=bias)
    packed = PackedLinear(lin)
    for rows in (1, 2, 5, 8, 9, 16, 17, 40):
        x = torch.randn(rows, k)
        with torch.inference_mode():
            torch.testing.assert_close(packed(x), lin(x), atol=1e-5, rtol=1e-5)
    x = torch.randn(2, 3, k)  # leading dimensions kept
    with torch.inference_mode():
        assert packed(x).shape == (2, 3, n)
        torch.testing.assert_close(packed(x), lin(x), atol=1e-5, rtol=1e-5)


def test_a_row_does_not_depend_on_the_rows_beside_it():
    """Bit for bit: the rows of a 40-row product (three blocks of 16 rows, 16- and 8-lane tiles) equal
    the same rows computed alone or among fewer. A verification row then gets exactly what a one-row
    step would."""
    torch.manual_seed(0)
    packed = PackedLinear(nn.Linear(576, 200, bias=True))
    x = torch.randn(40, 576)
    with torch.inference_mode():
        full = packed(x)
        for rows in (1, 2, 3, 7, 8, 9, 15, 16, 17, 33):
            assert torch.equal(packed(x[:rows]), full[:rows]), rows
        assert torch.equal(packed(x[23:24]), full[23:24])


def test_the_twin_shares_weights_and_leaves_the_model_alone(tiny_llama):
    twin = with_packed_linears(tiny_llama)
    assert isinstance(twin.lm_head, PackedLinear) and isinstance(tiny_llama.lm_head, nn.Linear)
    assert not any(isinstance(m, PackedLinear) for m in tiny_llama.modules())
    assert twin.model.embed_tokens.weight is tiny_llama.model.embed_tokens.weight  # shared, not copied
    ids = torch.tensor([[1, 5, 9, 12, 40]])
    with torch.inference_mode():
        torch.testing.assert_close(twin(ids).logits, tiny_llama(ids).logits, atol=1e-5, rtol=1e-5)


def test_wrong_inputs_are_refused():
    packed = PackedLinear(nn.Linear(8, 12))
    with pytest.raises(RuntimeError, match="features"):
        packed(torch.randn(2, 9))
    with pytest.raises(RuntimeError, match="float32"):
        packed(torch.randn(2, 8, dtype=torch.float64))


def test_a_killed_build_s_lock_is_removed_and_a_live_one_kept(tmp_path):
    """torch waits forever on the lock a killed build leaves: one older than any build goes, a fresh one stays."""
    import os
    import time

    from specbench.decoding.packed_linear import clear_stale_baton

    baton = tmp_path / "lock"
    baton.touch()
    assert not clear_stale_baton(str(tmp_path), stale_after=600) and baton.exists()  # a build under way
    old = time.time() - 3600
    os.utime(baton, (old, old))
    assert clear_stale_baton(str(tmp_path), stale_after=600) and not baton.exists()
    assert not clear_stale_baton(str(tmp_path))  # nothing left to remove

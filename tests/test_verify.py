import pytest
import torch

from specbench.decoding.verify import accept_path, row_argmax
from specbench.draft import DraftTree


def test_accepts_longest_matching_path():
    # root -> 1(a), root -> 2(b); 1 -> 3(c); 2 -> 4(d)
    tree = DraftTree((0, 0, 1, 2))
    tokens = [10, 11, 12, 13]
    # target: after root 11 (node 2), after node 2 -> 13 (node 4), after node 4 -> 99
    targets = [11, 0, 13, 0, 99]
    assert accept_path(tree, tokens, targets) == ([2, 4], 99)


def test_rejects_everything():
    tree = DraftTree((0, 1))
    assert accept_path(tree, [5, 6], [7, 5, 6]) == ([], 7)


def test_empty_tree_is_plain_step():
    assert accept_path(DraftTree(()), [], [42]) == ([], 42)


def test_full_chain_accepted_gives_bonus():
    tree = DraftTree.chain(3)
    assert accept_path(tree, [1, 2, 3], [1, 2, 3, 4]) == ([1, 2, 3], 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_row_argmax_is_torchs_argmax_ties_and_nan_included(dtype):
    x = torch.randn(6, 640, generator=torch.Generator().manual_seed(0))
    x[0, 5] = x[0, 9] = 50  # a tie: the first
    x[1, 7] = x[1, 3] = float("nan")  # NaN wins, the first one
    x[2] = float("-inf")
    x[3, 100] = x[3, 200] = float("inf")
    x = x.to(dtype)
    for rows in (x, x[4], x[:, ::2], x[1:5]):
        got = row_argmax(rows)
        assert got.dtype == torch.long and torch.equal(got, rows.argmax(dim=-1))

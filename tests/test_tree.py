import pytest
import torch

from specbench.drafting.recycling import PUBLISHED_TREE
from specbench.draft import DraftTree
from specbench.decoding.masks import tree_attention_mask


def test_published_template_shape():
    tree = DraftTree.from_children_counts(PUBLISHED_TREE)
    assert len(tree) == 80 and tree.size == 81 and tree.max_depth == 6
    per_depth = [int((tree.depths == d).sum()) for d in range(1, 7)]
    assert per_depth == [8, 21, 25, 15, 8, 3]


def test_breadth_first_expansion_and_ranks():
    # root has 2 children; first child has 2, second has 1
    tree = DraftTree.from_children_counts([[2], [2, 1]])
    assert tree.parents == (0, 0, 1, 1, 2)
    assert tree.sibling_rank() == [0, 1, 0, 1, 0]
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2]
    assert tree.path_to(5) == [2, 5]


def test_ancestor_mask():
    tree = DraftTree((0, 0, 1))  # root -> 1, root -> 2, 1 -> 3
    expected = torch.tensor([
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree.ancestor_mask, expected)


def test_attention_mask_prefix_and_sliding_window():
    tree = DraftTree((0, 1))  # chain of 2
    m = tree_attention_mask(tree.ancestor_mask, tree.depths, 5, torch.float32, "cpu")
    assert m.shape == (1, 1, 3, 8)
    allowed = m[0, 0] == 0
    assert allowed[:, :5].all()
    assert torch.equal(allowed[:, 5:], tree.ancestor_mask)
    # window 4: row at position 5+d sees prefix positions j > 5 + d - 4
    s = tree_attention_mask(tree.ancestor_mask, tree.depths, 5, torch.float32, "cpu", sliding_window=4)
    allowed = s[0, 0] == 0
    assert allowed[0, :5].tolist() == [False, False, True, True, True]
    assert allowed[2, :5].tolist() == [False, False, False, False, True]


def test_bad_templates_are_refused():
    with pytest.raises(ValueError, match="no draft nodes"):
        DraftTree.from_children_counts([[0]])
    with pytest.raises(ValueError, match="depth 1"):
        DraftTree.from_children_counts([[2], [1]])
    with pytest.raises(ValueError, match="parent"):
        DraftTree((0, 3))

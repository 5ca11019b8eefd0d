from specbench.draft import DraftTree
from specbench.decoding.verify import accept_path


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

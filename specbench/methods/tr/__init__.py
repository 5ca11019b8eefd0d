"""Token Recycling: one drafter, the matrix and a chooser of what each step verifies: the whole template
(tr, base), the goodput sub-tree (tr_adaptive, adaptive) or that sub-tree merged with retrieval (tr_fused,
fused)."""

"""How much to speculate: the forward cost curve t(w) with its roofline floor and the speedup bound,
the goodput chooser that picks a draft's sub-tree from them, and the batch policies (fixed, goodput)."""

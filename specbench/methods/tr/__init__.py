"""Token Recycling: the static method (base), the cost-aware sub-tree choice (adaptive) and the
fused drafter with a retrieval source (fused); the statistics every run counts and the tree tuning."""

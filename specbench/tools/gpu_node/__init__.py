"""The prepared command for a GPU node without network (docs/gpu.md), as package code.

`scripts/gpu_pack.py` (here) and `scripts/gpu_check.py` (on the node) are thin entry points over it:

- `limits`: what a call may carry and bring back, the stages and the seconds each is sure of;
- `pack`: the wheels, questions and weight parts beside the checkout, and the plan of calls;
- `node`: the carried parts gathered in the node's folder and the weights assembled from them;
- `jobs`: a stage's process and its jobs under a budget, and what their logs say;
- `monitor`: the GPU's clocks and the container's CPU throttling while a stage runs;
- `real_model`: the methods on the embedded model through the runner, a throwaway warm-up first;
- `stages`: what each stage does;
- `summary`: summary.md from the stages' results;
- `driver`: every stage in order, each in a process of its own, then what comes back.

The node runs these from the checkout with its own Python (torch, transformers; no specbench
installed, no hydra until the probe installs the carried wheels): every module here imports only
the standard library at import time and reaches for specbench, torch or hydra inside the functions
that need them. Being in tools/, none of it imports run/ or main.py: the real-model stages get the
runner as a function from `scripts/gpu_check.py`.
"""

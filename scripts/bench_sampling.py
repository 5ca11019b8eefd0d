#!/usr/bin/env python
"""What position-keyed sampling costs the harness per step (specbench/decoding/sampling.py): the Gumbel
noise for 1, 4 and 7 positions over SmolLM2's vocabulary, one position on the host path the sampler
takes on a CPU without its kernel (HostNoise), and a sampled tree step (7 rows over 5
depths, 60 steps moving forward by 1-2 accepted tokens) with each position drawn afresh against drawn
once and reused, and through `specbench::sample_keyed` (no row drawn: SPECBENCH_SAMPLING_KERNEL unset)
on rows of the scale given; and the verifier's argmax over 1, 5 and 81 rows, torch's against the numpy
path `row_argmax` takes on a CPU. Run it alone on the machine. The keyed kernel's cost depends on how many
entries of a row lie within reach of its best (--scale: the logits' spread; real rows: bench_drafting.py).

    python scripts/bench_sampling.py [--vocab 49152] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from specbench.decoding.sampling import KERNEL_ENV, HostNoise, PositionSampler, gumbel_noise
from specbench.decoding.verify import row_argmax


def ms_per_call(fn, n: int = 30) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def sampler_with(kernel: bool) -> PositionSampler:
    """A T = 0.7 sampler on the host through `sample_keyed`, or drawing whole rows."""
    if not kernel:
        os.environ[KERNEL_ENV] = "off"
    sampler = PositionSampler(0.7)
    try:
        sampler.prepare("cpu")  # decides, and builds the table, untimed
    finally:
        os.environ.pop(KERNEL_ENV, None)
    return sampler


def tree_step_ms(vocab: int, reuse: bool, kernel: bool, scale: float, steps: int = 60) -> float:
    sampler, base, g = sampler_with(kernel), 100, torch.Generator().manual_seed(0)
    logits = [torch.randn(7, vocab, generator=g) * scale for _ in range(steps)]
    t = time.perf_counter()
    for x in logits:
        positions = torch.tensor([base + d for d in (0, 1, 1, 2, 2, 3, 4)])
        if not reuse:
            sampler.bind("afresh", base)  # a new stream each step: nothing drawn before is reused
        sampler(x, positions)
        base += 1 + int(torch.randint(0, 2, (1,), generator=g))
    return (time.perf_counter() - t) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scale", type=float, default=4.0, help="the random logits' standard deviation")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for k in (1, 4, 7):
        positions = torch.arange(100, 100 + k)
        print(f"gumbel_noise, {k} position(s) at once: {ms_per_call(lambda: gumbel_noise(1, positions, args.vocab)):.2f} ms")
    host = HostNoise()
    print(f"HostNoise, 1 position: {ms_per_call(lambda: host(1, 100, args.vocab)):.2f} ms")
    print(f"sampled tree step (7 rows, 5 depths, logits N(0, {args.scale}^2)): rows drawn afresh "
          f"{tree_step_ms(args.vocab, False, False, args.scale):.2f} ms, drawn once and reused "
          f"{tree_step_ms(args.vocab, True, False, args.scale):.2f} ms, sample_keyed "
          f"{tree_step_ms(args.vocab, True, True, args.scale):.2f} ms")
    for rows in (1, 5, 81):
        x = torch.randn(rows, args.vocab, generator=torch.Generator().manual_seed(rows))
        print(f"argmax over {rows} row(s): torch {ms_per_call(lambda: x.argmax(dim=-1), 200):.3f} ms, "
              f"row_argmax {ms_per_call(lambda: row_argmax(x), 200):.3f} ms")


if __name__ == "__main__":
    main()

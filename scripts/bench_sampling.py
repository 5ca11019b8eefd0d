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
    python scripts/bench_sampling.py --real [--temperatures 0.7,1.0] [--threads 1]

`--real` samples rows of the embedded SmolLM2-135M's own logits instead (every other position of the
tests' six Spec-Bench prompts, one forward each): ms a row through `sample_keyed` against whole rows
drawn (a new position each row, as a decoding meets them), the same tokens checked.
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


def real_rows() -> torch.Tensor:
    """Every other position's logits of the tests' six Spec-Bench prompts, on the embedded model."""
    from pathlib import Path

    from specbench.inputs.chat import prompt_ids
    from specbench.inputs.models import load_model, named_model_config
    from specbench.inputs.tasks import load_jsonl_questions, select_per_subtask

    model, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), torch.float32)
    sample = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "spec_bench_sample.jsonl"
    rows = []
    for q in select_per_subtask(load_jsonl_questions(sample), 1):
        ids = torch.tensor([prompt_ids(tok, [{"role": "user", "content": q.turns[0]}])])
        with torch.no_grad():
            rows.append(model(ids).logits[0, ::2].float())
    return torch.cat(rows)


def real_ms(logits: torch.Tensor, temperature: float, kernel: bool) -> tuple[float, torch.Tensor]:
    """ms a row sampling `logits` one row at a time, each at a new position, and the tokens."""
    sampler = sampler_with(kernel)
    sampler.temperature = temperature
    positions = torch.arange(logits.shape[0])
    sampler(logits[:1], positions[:1] + 10**6)  # first-call costs, at a position no row uses
    t = time.perf_counter()
    tokens = [sampler(logits[i : i + 1], positions[i : i + 1]) for i in range(logits.shape[0])]
    return (time.perf_counter() - t) / logits.shape[0] * 1e3, torch.cat(tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scale", type=float, default=4.0, help="the random logits' standard deviation")
    ap.add_argument("--real", action="store_true", help="rows of SmolLM2's own logits (module docstring)")
    ap.add_argument("--temperatures", default="0.7,1.0", help="with --real")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.real:
        logits = real_rows()
        for temperature in map(float, args.temperatures.split(",")):
            keyed, a = real_ms(logits, temperature, True)
            whole, b = real_ms(logits, temperature, False)
            print(f"T = {temperature}, {logits.shape[0]} rows of SmolLM2's logits: sample_keyed {keyed:.3f} ms a row, "
                  f"whole rows drawn {whole:.3f} ms a row ({whole / keyed:.1f}x); the same tokens: {torch.equal(a, b)}")
        return
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

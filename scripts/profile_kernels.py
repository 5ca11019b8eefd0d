"""Where the verification forward's time goes, kernel by kernel, at a few row counts w.

    python scripts/profile_kernels.py --compile                 # compiled forward, w = 1,2,8,16
    python scripts/profile_kernels.py --widths 1,8,32 --out results/cpu-compiled/kernels.md

For each w, `--steps` forwards of w rows after `--context` cached tokens (the steps of
scripts/profile_cost.py) run under torch.profiler; the table gives each kernel's self time per step
and, for each matrix product, the weight bandwidth and FLOP rate it achieved, beside the machine's
own figures (the roofline's float32 sum bandwidth and large-matmul throughput). The profiler and
inductor's kernel records add overhead, so take times from profile_cost.py and shares from here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from specbench.decoding.forward_choice import PRODUCTS
from specbench.decoding.engine import Engine
from specbench.decoding.kv_cache import compact_kv_cache
from specbench.speculation.cost import filled_cache_and_drafts
from specbench.tools.kernel_profile import breakdown_table, kernel_times
from specbench.speculation.roofline import roofline_for
from specbench.timing import now
from specbench.inputs.models import add_model_arguments, load_model_from_arguments


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    ap.add_argument("--widths", default="1,2,8,16", help="comma-separated row counts")
    ap.add_argument("--context", type=int, default=400, help="cached tokens before the forward")
    ap.add_argument("--steps", type=int, default=10, help="profiled forwards per width")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=12, help="kernels shown")
    ap.add_argument("--compile", action="store_true", help="the compiled forward (specbench/decoding/compiled.py)")
    ap.add_argument("--products", default="auto", choices=PRODUCTS,
                    help="the compiled forward's matrix products (compile_products; auto = packed where it runs)")
    ap.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = ap.parse_args(argv)
    widths = sorted({int(w) for w in args.widths.split(",")})
    if min(widths) < 1 or args.steps < 1:
        ap.error(f"--widths must be positive row counts and --steps at least 1 (got {args.widths}, {args.steps})")

    mcfg, model, _, device, dtype = load_model_from_arguments(ap, args)
    if args.compile:  # inductor names its kernels in the profile only when asked before compiling
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    engine = Engine(model, [], compiled=args.compile, products=args.products)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    by_rows, wall = {}, {}
    with torch.inference_mode():
        cache, prefix, drafts = filled_cache_and_drafts(model, engine, widths, args.context)

        def step(w):
            engine.forward_rows(cache, args.context, drafts[w], root=int(prefix[-1]))
            compact_kv_cache(cache, args.context, [])

        for w in widths:
            for _ in range(args.warmup):
                step(w)
            with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
                t0 = now(device)
                for _ in range(args.steps):
                    step(w)
                wall[w] = (now(device) - t0) / args.steps * 1e3
            by_rows[w] = kernel_times(prof.key_averages(group_by_input_shape=True), args.steps)
            print(f"  w={w}: {wall[w]:.1f} ms per step under the profiler", flush=True)

    rl = roofline_for(model)
    head = (f"{mcfg['name']}, {args.dtype}, {engine.compiled.name if args.compile else 'eager'} forward on {device}, "
            f"context {args.context}, {args.steps} steps per width; machine: {rl.bandwidth / 1e9:.1f} GB/s "
            f"(float32 sum), {rl.throughput / 1e9:.1f} GFLOP/s ({rl.matmul_size}^3); weights "
            f"{rl.weight_bytes / 1e6:.0f} MB per step\n\nwall ms per step under the profiler: "
            + ", ".join(f"w={w}: {wall[w]:.1f}" for w in widths))
    table = breakdown_table(by_rows, itemsize=torch.tensor([], dtype=dtype).element_size(), top=args.top)
    print(head + "\n\n" + table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(head + "\n\n" + table + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Profile the model's verification-forward cost curve t(w), w = 1..W rows, on this device/dtype.

    python scripts/profile_cost.py                       # smollm2-135m, w = 1..81, context 400
    python scripts/profile_cost.py --model vicuna-7b --device cuda --dtype float16 --max-width 128
    python scripts/profile_cost.py --compile              # the compiled forward (compile=on runs)
    python scripts/profile_cost.py --compile --products inductor   # ... with inductor's own products
    python scripts/profile_cost.py --contexts 1024,2048,4096,8064   # task=long's contexts (contexts_for)

Writes the curve to the cache the runner and adaptive TR read ($SPECBENCH_CACHE/cost/, one file
per model, device name, dtype and set of --contexts) and, with --out, a copy there. Also measures
the machine's memory read bandwidth and matmul throughput in the model's dtype and stores them in
the curve with the model's weight bytes and FLOPs per row (specbench/speculation/roofline.py).
Prints t(w) in ms beside the roofline floor(w) = max(weight bytes / bandwidth, FLOPs(w) /
throughput) and t(w) / floor(w).
With --contexts, also times the widths after each of those numbers of cached tokens and prints t(w)
per context; a run finds the cached curve when they are the ones `cost.contexts_for` gives it.
"""

from __future__ import annotations

import argparse
import sys

from specbench.decoding.forward_choice import PRODUCTS
from specbench.decoding.engine import Engine
from specbench.speculation.cost import CostCurve, cache_path, measure_cost_curve
from specbench.speculation.roofline import width_ratios
from specbench.inputs.models import add_model_arguments, load_model_from_arguments


def context_table(curve: CostCurve, most: int = 8) -> str:
    """t(w) in ms per measured context (at most `most` widths: the first, the last, and between), with
    t(W)/t(1) for the widest W beside the roofline's floor(W)/floor(1) at that context."""
    ws = curve.widths
    shown = sorted({ws[round(i * (len(ws) - 1) / (most - 1))] for i in range(most)}) if len(ws) > most else ws
    top = ws[-1]
    lines = ["context " + "".join(f"{f'w={w}':>9}" for w in shown) + f"{f't({top})/t(1)':>13}" + "  floor ratio"]
    for c, _ in curve.grid():
        ratio = curve.t(top, c) / curve.t(1, c)
        fl = curve.floor(top, c) / curve.floor(1, c)
        lines.append(f"{c:>7} " + "".join(f"{curve.t(w, c) * 1e3:9.1f}" for w in shown) + f"{ratio:13.2f}{fl:13.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    ap.add_argument("--max-width", type=int, default=81, help="W: rows up to root + 80 draft nodes")
    ap.add_argument("--widths", default=None, help="comma-separated widths instead of 1..W")
    ap.add_argument("--context", type=int, default=400, help="cached tokens before the forward")
    ap.add_argument("--contexts", default="", help="comma-separated longer contexts, each timed too")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="time the compiled forward (specbench/decoding/compiled.py)")
    ap.add_argument("--products", default="auto", choices=PRODUCTS,
                    help="the compiled forward's matrix products (compile_products; auto = packed where it runs)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--no-cache", action="store_true", help="do not write the runner's cache")
    args = ap.parse_args(argv)

    mcfg, model, _, _, _ = load_model_from_arguments(ap, args)
    widths = ([int(w) for w in args.widths.split(",")] if args.widths
              else list(range(1, args.max_width + 1)))
    curve = measure_cost_curve(model, widths, context_len=args.context, repeats=args.repeats,
                               warmup=args.warmup, model_name=mcfg["name"], dtype_name=args.dtype,
                               progress=True, machine=True, engine=Engine(model, [], compiled=args.compile,
                                                                                  products=args.products),
                               contexts=[int(c) for c in args.contexts.split(",") if c.strip()])
    if args.compile and curve.forward == "eager":
        # the compiled forward fell back to eager (said above in one warning line): a curve labelled
        # eager would make every compile=on run refuse it, one labelled compiled would be false
        print("error: --compile was asked for but the compiled forward could not run here (see the warning "
              "above), so no curve was written; profile without --compile and run with compile=off",
              file=sys.stderr)
        return 2
    paths = []
    if not args.no_cache:
        paths.append(curve.save(cache_path(curve.model, curve.device, curve.dtype, curve.forward, curve.contexts)))
    if args.out:
        paths.append(curve.save(args.out))
    print(f"{curve.model} on {curve.device}, {curve.dtype}, {curve.forward} forward, context {curve.context_len}, "
          f"median of {curve.repeats}" + (f", compiled in {curve.compile_seconds:.0f} s" if args.compile else ""))
    rl = curve.roofline
    print(f"bandwidth {rl.bandwidth / 1e9:.1f} GB/s (float32 sum), matmul {rl.throughput / 1e9:.1f} GFLOP/s "
          f"({rl.matmul_size}^3 {rl.dtype}); weights read per forward {rl.weight_bytes / 1e6:.1f} MB, "
          f"{2 * rl.linear_params / 1e6:.1f} MFLOP per row + {rl.attn_per_key} FLOP per row per attended token")
    for w, t in zip(curve.widths, curve.times):
        f = curve.floor(w)
        print(f"{f'w={w}:':<6} t {t * 1e3:7.1f} ms   floor {f * 1e3:7.1f} ms   t/floor {t / f:5.2f}   "
              f"{rl.limit(w, curve.context_len)}-bound")
    ratios = width_ratios(curve, (2, 4, 8, 16, 32))
    if ratios:
        print("  ".join(f"t({r['w']})/t(1) {r['t_ratio']:.2f}" + ("" if r["floor_ratio"] is None else
                        f" (floor {r['floor_ratio']:.2f})") for r in ratios))
    if curve.contexts:
        print(context_table(curve))
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

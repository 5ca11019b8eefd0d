"""Cost curve of a named model shape with random weights, and each method's predicted speedup on it.

    python scripts/shape_cost.py --shape vicuna-7b --device cuda --dtype float16 --out results/gpu-shapes
    python scripts/shape_cost.py --shape vicuna-13b --device cuda --dtype float16 --compile --out ...
    python scripts/shape_cost.py --shape tiny-7b --device cpu --dtype float32 --out /tmp/shape   # rehearsal

A forward's time does not depend on the weights' values, so a model of the shape built on the device
with random weights (specbench/speculation/shapes.py) times the real model's forward with no network and
no checkpoint. Writes OUT/cost_<shape>_<forward>.json (the curve, roofline included) and
OUT/predictions_<shape>_<forward>.md (MAT x t(1) / t(rows) per method, from the published MATs and from
this harness's committed CPU traces: specbench/speculation/predictions.py); prints t(1), t(81)/t(1),
t(1) against the roofline floor and the table. Widths: a sparse set up to --max-width by default,
`--widths all` for every width 1..W, or a comma-separated list. Compiled on CUDA, a width is padded to the
step's row bucket, as a run pays it; `--buckets widths` compiles a graph per width instead, for the
forward's own curve (what finer buckets would pay), at a compile each (`_per_width` in the file names).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from specbench.errors import SettingsError
from specbench.speculation.predictions import markdown_table, predictions
from specbench.speculation.shapes import SHAPES, SPARSE_WIDTHS, STAND_INS, measure_shape_curve, random_model
from specbench.inputs.models import resolve_device, resolve_dtype

TREE_ROWS = 81  # TR's published tree: 80 nodes + root


def parse_widths(spec: str | None, max_width: int) -> list[int]:
    """The widths to time: the sparse set up to `max_width` (and `max_width` itself) by default,
    every width 1..max_width for 'all', else the comma-separated list."""
    if spec == "all":
        return list(range(1, max_width + 1))
    if spec:
        return sorted({int(w) for w in spec.split(",")} | {1})
    return sorted({w for w in SPARSE_WIDTHS if w <= max_width} | {1, max_width})


def summary_lines(curve) -> list[str]:
    """t(1), t(81)/t(1) and t(1) against the roofline floor, one line each."""
    t1 = curve.t(1)
    past = " (extrapolated)" if TREE_ROWS > curve.widths[-1] else ""
    lines = [f"t(1) = {t1 * 1e3:.2f} ms",
             f"t({TREE_ROWS})/t(1) = {curve.t(TREE_ROWS) / t1:.2f}{past} (t({TREE_ROWS}) = {curve.t(TREE_ROWS) * 1e3:.2f} ms)"]
    rl = curve.roofline
    if rl is not None:
        f1 = curve.floor(1)
        lines.append(f"t(1)/floor(1) = {t1 / f1:.2f} (floor {f1 * 1e3:.2f} ms, {rl.limit(1, curve.context_len)}-bound: "
                     f"{rl.weight_bytes / 1e6:.0f} MB at {rl.bandwidth / 1e9:.0f} GB/s, "
                     f"{rl.throughput / 1e12:.2f} TFLOP/s matmul in {rl.dtype})")
    return lines


def curve_line(curve) -> str:
    return "  ".join(f"t({w}) {t * 1e3:.2f}" for w, t in zip(curve.widths, curve.times)) + "  (ms)"


NOTES = ("predicted = MAT x t(1) / t(rows per step): target forwards only (drafting free, SpS's draft model and "
         "EAGLE's head included); published rows: that paper's MAT with the rows named; trace rows: this harness's "
         "CPU runs on SmolLM2-135M replayed step by step (their MATs are SmolLM2's; tr_adaptive, tr_fused and "
         "EAGLE-2 keep the rows they chose for the CPU's curve); published = the paper's measured A100 speedup.")


def predictions_markdown(curve, shape: str, rows: list[dict], build_seconds: float) -> str:
    head = (f"# Predicted speedups: {curve.model}\n\n{curve.device}, {curve.dtype}, {curve.forward} forward, "
            f"context {curve.context_len}, median of {curve.repeats}, {curve.created}; model built in "
            f"{build_seconds:.1f} s\n\n" + "\n".join(f"- {line}" for line in summary_lines(curve)) + "\n")
    return f"{head}\n{markdown_table(rows)}\n\n{NOTES}\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=list(SHAPES),
                    help="a real shape, or its CPU stand-in: " + ", ".join(f"{r} -> {t}" for r, t in STAND_INS.items()))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float16", help="float32, float16 or bfloat16")
    ap.add_argument("--compile", action="store_true", help="time the compiled engine (reported if it falls back)")
    ap.add_argument("--max-width", type=int, default=128)
    ap.add_argument("--widths", default=None, help="comma-separated widths, or 'all' for 1..max-width")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--context", type=int, default=400, help="cached tokens before the timed forward")
    ap.add_argument("--buckets", default="harness", choices=["harness", "widths"],
                    help="--compile on CUDA: the step's own row buckets (what a run pays: every width padded to "
                         "its bucket), or one graph per width (the forward's own curve, a compile each)")
    ap.add_argument("--out", required=True, help="folder for the curve and the predictions")
    args = ap.parse_args(argv)
    try:
        device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
        widths = parse_widths(args.widths, args.max_width)
    except SettingsError as e:
        ap.error(str(e))
    except ValueError:
        ap.error(f"--widths '{args.widths}': give comma-separated integers or 'all'")

    import transformers.models.llama.modeling_llama  # noqa: F401  (imported before the build is timed)

    t0 = time.perf_counter()
    model = random_model(args.shape, device, dtype)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    build_seconds = time.perf_counter() - t0
    print(f"built {args.shape} with random weights on {device} in {args.dtype} in {build_seconds:.1f} s", flush=True)

    per_width = args.compile and args.buckets == "widths"
    if per_width:  # read by the compiled forward's padding and preparation (decoding/compiled.py)
        import specbench.decoding.compiled as compiled_forward

        compiled_forward.CUDA_ROW_BUCKETS = tuple(widths)
    curve = measure_shape_curve(model, args.shape, widths, context_len=args.context, repeats=args.repeats,
                                warmup=args.warmup, compiled=args.compile)
    if args.compile and curve.forward == "eager":
        print("warning: the compiled engine fell back to eager: this curve is the eager forward's", file=sys.stderr)
    out = Path(args.out)
    tag = f"{curve.forward}_per_width" if per_width and curve.forward != "eager" else curve.forward
    curve_path = curve.save(out / f"cost_{args.shape}_{tag}.json")
    rows = predictions(curve, args.shape)
    table_path = out / f"predictions_{args.shape}_{tag}.md"
    table_path.write_text(predictions_markdown(curve, args.shape, rows, build_seconds))

    print(f"{curve.model} on {curve.device}, {curve.dtype}, {curve.forward} forward, context {curve.context_len}, "
          f"median of {curve.repeats}" + (f", compiled in {curve.compile_seconds:.0f} s" if args.compile else ""))
    if device.type == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")
    for line in summary_lines(curve):
        print(line)
    print(curve_line(curve))
    print()
    print(markdown_table(rows))
    print()
    print(f"wrote {curve_path}\nwrote {table_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

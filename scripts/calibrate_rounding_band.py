"""The lossless check's rounding band on this machine: the spread of near-top margins between a tree
forward, AR's one-row steps and the teacher-forced forward, per dtype (specbench/run/rounding_band.py;
docs/protocol.md, "Lossless check"). Prints the figures; a run measures (or loads) the same before timing.

    python scripts/calibrate_rounding_band.py [--model smollm2-135m] [--device cpu] [--dtypes bfloat16,float16,float32]
"""
import argparse

import torch

from specbench.run.rounding_band import BAND_ULPS
from specbench.run.rounding_band import measure_band
from specbench.inputs.models import load_model, named_model_config, resolve_device

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--model", default="smollm2-135m")
ap.add_argument("--device", default="cpu")
ap.add_argument("--dtypes", default="bfloat16,float16,float32")
ap.add_argument("--new-tokens", type=int, default=24)
args = ap.parse_args()

device = resolve_device(args.device)
for name in args.dtypes.split(","):
    model, tok = load_model(named_model_config(args.model), device, getattr(torch, name))
    b = measure_band(model, tok, name, new_tokens=args.new_tokens)
    by = ", ".join(f"{k} {v['logits']:.3g} ({v['ulps']:.2f} ulps)" for k, v in b["measured_by_forward"].items())
    print(f"{name} on {b['device']}: largest margin spread {b['measured_logits']:.3g} logits = "
          f"{b['measured_ulps']:.2f} ulps ({by}; rows {b['rows_compared']}); band x{b['safety']:g} = "
          f"{b['band_ulps']:.2f} ulps (assumed before: {BAND_ULPS[name]}); largest |d logit| over the "
          f"vocabulary {b['max_abs_dlogit']:.3g}; {b['seconds']:.1f} s", flush=True)

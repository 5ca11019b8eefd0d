"""The GPU view without a GPU: each method's committed step traces (rows verified and tokens accepted
per step) replayed on another machine's cost curve, beside the speedup the run measured where it ran.

    python scripts/replay_traces.py results/gpu/cost/cost_vicuna-7b_eager.json \
        [--traces results/cpu-headline-v3,results/cpu-coupled] [--extra results/gpu-view]

A run under --extra (e.g. tr_adaptive / tr_fused choosing their trees from that curve, made with
`method.cost_curve=<the curve>`) is listed as its own row beside the current traces. Predicted =
MAT x t(1) / t(rows) step by step (`cost.run_bound`): target forwards only, drafting free.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specbench import markdown
from specbench.errors import SettingsError
from specbench.registry import drafter_class
from specbench.speculation.cost import CostCurve, run_bound
from specbench.speculation.predictions import CURRENT_TRACES, ROOT, greedy_runs, read_answers


def replay(curve: CostCurve, run: Path) -> dict | None:
    bound = run_bound(curve, read_answers(run))
    if bound is None:
        return None
    summary = json.loads((run / "summary.json").read_text())
    speedup = (summary.get("speedup") or {}).get("overall")
    params = summary.get("method_params") or {}
    where = run.relative_to(ROOT) if run.is_relative_to(ROOT) else run
    return {"method": summary["method"], "run": str(where), "mat": summary.get("mat"),
            "rows": bound["mean_rows"], "predicted": bound["bound"], "measured": speedup,
            "curve_from": params.get("cost_curve"), "setting": setting(summary["method"], params)}


def setting(method: str, params: dict) -> str:
    """The run's settings that differ from the method's defaults today (its curve aside), as
    `name=value`; settings the method no longer has, or gained after the run, are not shown."""
    try:
        defaults = drafter_class(method).parameters()
    except SettingsError:  # a method this checkout no longer registers
        return ""
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items())
                     if k in defaults and k != "cost_curve" and defaults[k] != v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("curve", help="a cost_curve.json (e.g. results/gpu/cost/cost_vicuna-7b_eager.json)")
    ap.add_argument("--traces", default=",".join(CURRENT_TRACES), help="folders of current runs, comma list")
    ap.add_argument("--extra", default="", help="more folders, listed beside them")
    ap.add_argument("--temperature", default="0", help="the runs at this temperature, as their directories "
                                                        "spell it (0, 0.7, 1.0); a trace's rows and accepted "
                                                        "lengths replay the same way sampled or greedy")
    args = ap.parse_args(argv)
    curve = CostCurve.load(args.curve)
    folders = [f for f in args.traces.split(",") + args.extra.split(",") if f]
    rows, seen = [], set()
    for run in greedy_runs(folders, temperature=args.temperature):
        if not (run / "summary.json").is_file():
            continue
        r = replay(curve, run)
        key = (r or {}).get("method"), (r or {}).get("curve_from"), (r or {}).get("setting")
        if r is None or key in seen:  # the first folder holding a method (with that curve and setting) wins
            continue
        seen.add(key)
        rows.append(r)
    rows.sort(key=lambda r: -r["predicted"])
    c = json.loads(Path(args.curve).read_text())
    print(f"T = {args.temperature}, replayed on {c['model']}, {c['device']}, {c['dtype']}, {c.get('forward', 'eager')}: "
          f"t(1) = {1e3 * curve.t(1):.2f} ms, t(81)/t(1) = {curve.t(81) / curve.t(1):.2f}\n")
    print(markdown.markdown_table(
        ["method", "setting", "trees chosen for", "MAT", "rows/step", "predicted here", "measured where it ran", "run"],
        [[r["method"], r["setting"] or "-", "this curve" if r["curve_from"] else "its own machine's curve", f"{r['mat']:.2f}",
          f"{r['rows']:.1f}", f"{r['predicted']:.2f}x", "-" if r["measured"] is None else f"{r['measured']:.2f}x",
          r["run"]] for r in rows], align="lllrrrrl"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

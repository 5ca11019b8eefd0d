#!/usr/bin/env python
"""Fit a static Token Recycling template to this model and machine from a calibration run.

    # 1. calibration prompts that are in no benchmark task (those the Medusa heads were trained on)
    python scripts/tune_tree.py --write-calibration-questions data/trees/calibration_questions.jsonl
    # 2. a calibration run with a large template (per-node acceptance is recorded by every TR run)
    python run.py method=tr task=jsonl task.path=data/trees/calibration_questions.jsonl \\
        max_new_tokens=128 baseline=none results_dir=results/calibration/tr
    # 3. the template with the most expected tokens per second on the run's cost curve
    python scripts/tune_tree.py results/calibration/tr --out data/trees/smollm2-135m-cpu.json
    python run.py method=tr method.tree=data/trees/smollm2-135m-cpu.json

The math is in specbench/drafting/template_tuning.py: node probabilities from the run's counts (and,
beyond its template, from pooled per-depth, per-rank conditional rates), greedy growth, the best
prefix under t(w) + per-step overhead. The overhead (work per step the cost curve does not see:
drafting, verification, KV compaction) is estimated from the run's own timings unless given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specbench.run.metrics import sum_statistics
from specbench.speculation.cost import CostCurve
from specbench.drafting.recycling import load_tree_template
from specbench.drafting.template_tuning import trim_template, tune_template

ROOT = Path(__file__).resolve().parents[1]


def write_calibration_questions(path: Path, n: int, seed: int) -> None:
    from specbench.tools.training_data import select_prompts  # non-benchmark prompts, overlap-checked

    prompts, _ = select_prompts(n, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"question_id": f"calib-{i}", "category": p["source"], "turns": [p["text"]]}) + "\n")
    print(f"wrote {len(prompts)} calibration questions to {path}")


def load_records(run_dirs: list[Path]) -> list[dict]:
    from specbench.report.collect import load_run

    records = []
    for d in run_dirs:
        if not (d / "run_config.json").is_file():
            sys.exit(f"error: {d} is not a run directory (no run_config.json); give the results "
                     f"directory of a method=tr calibration run")
        records += load_run(d).records
    return records


def step_overhead(records: list[dict], curve: CostCurve) -> float:
    """Seconds per step beyond the cost curve: decoding time minus the curve's forward times."""
    spent = modelled = steps = 0.0
    for r in records:
        for t in r["turns"]:
            if not t.get("step_rows"):
                continue
            spent += t["wall_time"] - t["prefill_time"]
            modelled += sum(curve.t(w) for w in t["step_rows"])
            steps += len(t["step_rows"])
    return max(0.0, (spent - modelled) / steps) if steps else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path, help="calibration run directories (method=tr)")
    ap.add_argument("--out", type=Path, help="where the template JSON goes (default: print only)")
    ap.add_argument("--cost-curve", type=Path, help="cost curve JSON (default: the first run's)")
    ap.add_argument("--max-nodes", type=int, default=80, help="size budget: draft nodes at most")
    ap.add_argument("--k", type=int, default=8, help="candidates per matrix row: children per node at most")
    ap.add_argument("--overhead-ms", type=float, help="per-step overhead (default: from the runs' timings)")
    ap.add_argument("--overhead-from", type=Path, nargs="+", metavar="RUN",
                    help="timed runs to estimate the overhead from (default: the calibration runs; use "
                         "these when the calibration ran beside other work)")
    ap.add_argument("--write-calibration-questions", type=Path, metavar="PATH",
                    help="write non-benchmark calibration questions (jsonl) and exit")
    ap.add_argument("--trim", metavar="TREE", help="write TREE (published or a JSON file) without the nodes of "
                    "rank >= --k, for a matrix of k candidates per row, and exit")
    ap.add_argument("--n", type=int, default=24, help="how many calibration questions")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if args.write_calibration_questions:
        write_calibration_questions(args.write_calibration_questions, args.n, args.seed)
        return 0
    if args.trim:
        trimmed = trim_template(load_tree_template(args.trim), args.k)
        text = json.dumps({"children": trimmed, "trimmed_from": args.trim, "k": args.k}) + "\n"
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        print(text, end="")
        return 0
    if not args.runs:
        ap.error("give calibration run directories (or --write-calibration-questions)")
    records = load_records(args.runs)
    stats = sum_statistics([r.get("drafter_stats") for r in records])
    if not stats or "node_hits" not in stats:
        sys.exit("error: the runs hold no per-node statistics; calibrate with method=tr (this version "
                 "of specbench records them in every run)")
    curve_path = args.cost_curve or args.runs[0] / "cost_curve.json"
    if not curve_path.is_file():
        sys.exit(f"error: no cost curve at {curve_path}; give --cost-curve (scripts/profile_cost.py makes one)")
    curve = CostCurve.load(curve_path)
    timed = load_records(args.overhead_from) if args.overhead_from else records
    overhead = args.overhead_ms / 1e3 if args.overhead_ms is not None else step_overhead(timed, curve)
    tuned = tune_template(stats, lambda w: curve.t(w) + overhead, args.max_nodes, args.k)
    if not tuned["nodes"]:
        sys.exit("no template pays on this cost curve: every draft costs more than it is expected to save "
                 "(plain decoding, or method=tr_adaptive, which drafts only where it pays)")
    tuned.update(calibration={"runs": [str(d) for d in args.runs], "steps": stats["steps"],
                              "template": stats["tree"]},
                 cost_curve={"path": str(curve_path), "device": curve.device, "t1_ms": curve.t(1) * 1e3},
                 overhead_ms=overhead * 1e3, k=args.k, max_nodes=args.max_nodes)
    per_depth = [sum(level) for level in tuned["children"]]
    print(f"tuned template: {tuned['nodes']} nodes, depth {tuned['depth']} (per depth {per_depth}); "
          f"expected {tuned['expected_tokens']:.2f} tokens per step; estimated {tuned['speedup_estimate']:.2f}x "
          f"over plain decoding (t(1) = {curve.t(1) * 1e3:.1f} ms, overhead {overhead * 1e3:.1f} ms per step; "
          f"from {stats['steps']} calibration steps)")
    print(json.dumps(tuned["children"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(tuned, indent=1) + "\n")
        print(f"written: {args.out}  (use: method=tr method.tree={args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

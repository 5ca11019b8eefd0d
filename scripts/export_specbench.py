"""Write a run directory as Spec-Bench answer files (data/spec_bench/model_answer/*.jsonl layout).

    python scripts/export_specbench.py results/cpu/smollm2-135m/spec_bench-ps2/tr-t0-m128 --out answers/
    python scripts/export_specbench.py RUN_DIR --out DIR --report   # also print speed.py's figures

Writes <DIR>/<model_id>.jsonl (e.g. smollm2-135m-tr-float32-temp-0.0.jsonl) and, for a method run,
the AR answers it was compared with as <model>-vanilla-<dtype>-temp-<T>.jsonl, the two files
Spec-Bench's evaluation/speed.py takes (--file-path, --base-path). The AR answers come from the
run's baseline_answers.jsonl or, for baseline=shared / reuse runs, from the ar-... directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.report import specbench_format as sf


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="one run directory (run_config.json + answers.jsonl)")
    ap.add_argument("--out", required=True, help="directory for the answer files")
    ap.add_argument("--report", action="store_true",
                    help="print Spec-Bench's speed.py figures computed from the written files")
    ap.add_argument("--tokenizer", help="with --report: a tokenizer (path or hub id) to count the baseline's "
                                        "tokens as speed.py does, by re-tokenizing its texts")
    args = ap.parse_args(argv)

    run_dir = Path(args.run_dir)
    if not (run_dir / "run_config.json").is_file():
        print(f"error: {run_dir}: not a run directory (no run_config.json)", file=sys.stderr)
        return 2
    try:
        paths = sf.export_run(run_dir, args.out)
    except (sf.FormatError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"written: {paths['answers']}" + (f", {paths['baseline']}" if paths["baseline"] else ""))
    if args.report:
        if not paths["baseline"]:
            print("no baseline file (an AR run, or no AR answers found): nothing to compare with", file=sys.stderr)
            return 0
        tok = None
        if args.tokenizer:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(args.tokenizer)
        print(sf.format_speed_report(sf.specbench_speed_report(paths["answers"], paths["baseline"], tok)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

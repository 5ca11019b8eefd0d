"""Read Spec-Bench answer files (EAGLE, Hydra, SpS, ... runs) into a results root.

    python scripts/import_specbench.py --answers vicuna-7b-v1.3-eagle-float16.jsonl \\
        --baseline vicuna-7b-v1.3-vanilla-float16-temp-0.0.jsonl --method eagle --model vicuna-7b \\
        --out results/imported
    python scripts/make_tables.py results/imported

Writes <out>/<model>/<task>/imported-<method>-t<T>[-m<M>]/ with run_config.json, answers.jsonl,
baseline_answers.jsonl (with --baseline) and summary.json, which make_tables.py, plot.py and the
notebook read beside our own runs. Categories come from the answer lines, else from the question
file (default ../shared/data/spec_bench/question.jsonl when present). Temperature and dtype default
to what the model id says (Spec-Bench's '...-float16-temp-0.0'), else 0.0 and 'unknown'. Spec-Bench
keeps no token ids, so the lossless check is equal.py's text comparison (greedy, with a baseline) or
'unchecked'.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.report import specbench_format as sf

ROOT = Path(__file__).resolve().parents[1]


def default_questions() -> Path | None:
    for base in (Path.cwd(), ROOT):
        p = base / sf.DEFAULT_QUESTIONS
        if p.is_file():
            return p.resolve()
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--answers", required=True, help="the method's Spec-Bench answer file (.jsonl)")
    ap.add_argument("--baseline", help="the AR ('vanilla') answer file it is compared with")
    ap.add_argument("--method", required=True, help="method name for the tables (e.g. eagle, hydra, sps)")
    ap.add_argument("--model", required=True, help="model name for the tables (e.g. vicuna-7b)")
    ap.add_argument("--out", required=True, help="results root to write the run directory under")
    ap.add_argument("--questions", help="Spec-Bench question.jsonl (categories of lines that lack one)")
    ap.add_argument("--temperature", type=float, help="default: from the model id, else 0.0")
    ap.add_argument("--dtype", help="default: from the model id, else 'unknown'")
    ap.add_argument("--task", default="spec_bench", help="task name for the tables (default spec_bench)")
    ap.add_argument("--device", help="device name for the tables (default 'unknown')")
    ap.add_argument("--max-new-tokens", type=int, help="the run's max_new_tokens, if known")
    ap.add_argument("--overwrite", action="store_true", help="replace an earlier import of the same run")
    args = ap.parse_args(argv)

    questions = args.questions or default_questions()
    try:
        out = sf.import_answers(args.answers, args.out, args.method, args.model, baseline=args.baseline,
                                questions=questions, temperature=args.temperature, dtype=args.dtype,
                                task=args.task, device=args.device, max_new_tokens=args.max_new_tokens,
                                overwrite=args.overwrite)
    except (sf.FormatError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import json

    s = json.loads((out / "summary.json").read_text())
    sp = (s.get("speedup") or {}).get("overall")
    print(f"written: {out} ({s['questions']} questions, MAT {s['mat']:.2f}"
          + (f", speedup {sp:.2f}x" if sp else ", no baseline: no speedup")
          + (f", lossless (text) {s['lossless']['exact']}/{s['lossless']['checked']} equal"
             if s["lossless"]["checked"] else ", lossless unchecked") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())

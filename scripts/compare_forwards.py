"""Do two sweeps give the same tokens? Compares every answer (and AR baseline answer) of matching
runs in two results roots, question by question and turn by turn: e.g. the eager sweep against the
compiled one.

    python scripts/compare_forwards.py results/eager results/compiled   # two results roots
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.run.lossless import first_divergence
from specbench.run.results_io import read_jsonl


def answers(path: Path) -> dict:
    """question -> each turn's token ids, from the file or its gzipped copy (read_jsonl takes either)."""
    return {r["question_id"]: [t["token_ids"] for t in r["turns"]] for r in read_jsonl(path)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    total = same = 0
    runs_b = {p.parent for pattern in ("*/*/*/answers.jsonl", "*/*/*/answers.jsonl.gz") for p in args.b.glob(pattern)}
    for run_b in sorted(r / "answers.jsonl" for r in runs_b):
        rel = run_b.parent.relative_to(args.b)
        for name in ("answers.jsonl", "baseline_answers.jsonl"):
            b = answers(run_b.parent / name)
            # the eager sweep's repeats: -r1 ... -rN; any of them (greedy answers do not depend on the repeat)
            stem = rel.name.rsplit("-r", 1)[0]
            for run_a in sorted((args.a / rel.parent).glob(f"{stem}-r*")) or [args.a / rel]:
                a = answers(run_a / name)
                if a:
                    break
            for qid, turns_b in b.items():
                if qid not in a:
                    continue
                for t, (ta, tb) in enumerate(zip(a[qid], turns_b)):
                    total += 1
                    d = first_divergence(ta, tb)
                    if d is None:
                        same += 1
                    else:
                        print(f"{rel}/{name}: question {qid} turn {t}: first difference at token {d}")
    print(f"{same}/{total} turns equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Drafting cost per step of the retrieval drafters at a given context length (not a test).

    python scripts/bench_drafting.py --context 2048 [--questions question.jsonl]

The context is real text: Spec-Bench questions tokenized with the embedded model's tokenizer and
concatenated up to --context tokens. Times `propose` (PLD's n-gram search over the whole context,
REST's suffix-array lookup and trie) per call, median of --repeats calls; with --sweep it also
prints how the cost grows with the context length.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specbench.draft import DecodeState
from specbench.inputs.models import load_model, named_model_config
from specbench.registry import build_drafter
from specbench.inputs.tasks import MINI, load_jsonl_questions

ROOT = Path(__file__).resolve().parents[1]


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--questions", default=None, help="question.jsonl (default: the built-in mini set)")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--sweep", action="store_true", help="also 256, 512, 1024, ... up to --context")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    mcfg = named_model_config("smollm2-135m")
    model, tok = load_model(mcfg, torch.device("cpu"), torch.float32)
    qs = load_jsonl_questions(args.questions) if args.questions else list(MINI)
    ids: list[int] = []
    while len(ids) < args.context:
        for q in qs:
            ids += tok(" ".join(q.turns)).input_ids
    vocab = model.get_output_embeddings().weight.shape[0]
    drafters = {name: build_drafter(name, vocab_size=vocab, device="cpu", model=model,
                                    model_name="smollm2-135m", dtype_name="float32")
                for name in ("pld", "rest")}
    lengths = [n for n in (256, 512, 1024, 2048, 4096, 8192) if n < args.context] if args.sweep else []
    res = {"context": args.context, "repeats": args.repeats, "ms_per_propose": {}}
    for n in [*lengths, args.context]:
        seq = torch.tensor(ids[:n], dtype=torch.long)
        state = DecodeState(tokens=seq, prompt_len=n // 2, step=1)
        row = {name: median_ms(lambda d=d: d.propose(state), args.repeats) for name, d in drafters.items()}
        res["ms_per_propose"][n] = row
        print(f"context {n:5d}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row.items()))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Self-distilled chat corpus for a REST datastore: the model's own greedy answers to prompts that
are not benchmark questions.

The prompts are those the head trainers use (specbench/tools/training_data.py `select_prompts`: composed templates
for the chat categories, Python's reference docs, stdlib docstrings; any prompt sharing an 8-word
window with a Spec-Bench question or a built-in `mini` prompt is dropped), taken in its
source-balanced order. Answers are generated greedily in batches (its `greedy_answers`, the
benchmark's chat template), in chunks of that order, so a run stopped by --time-budget leaves a
source-balanced prefix. Each record of the output (jsonl, gzip when the name ends in .gz) is one
conversation as build_rest_datastore.py reads it:

  {"id": 17, "source": "writing", "messages": [{"role": "user", "content": PROMPT},
                                               {"role": "assistant", "content": ANSWER}],
   "answer_tokens": 128}

A rerun with the same output resumes: prompts already answered there are skipped.

Example (the corpus behind data/rest/smollm2-135m-chat):
  nice -n 19 python scripts/make_rest_corpus.py --model smollm2-135m --threads 1 --time-budget 22 \\
      --out data/rest/corpora/smollm2-135m-selfdistil.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import torch

from specbench.inputs.chat import prompt_ids
from specbench.inputs.models import eos_token_ids, load_model, resolve_device, resolve_dtype
from specbench.tools.training_data import greedy_answers, model_config, select_prompts

ROOT = Path(__file__).resolve().parents[1]


def _open(path: Path, mode: str, gz: bool | None = None):
    if gz if gz is not None else path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def read_records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with _open(path, "r") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a conf/model/<name>.yaml name")
    ap.add_argument("--model-path", help="override the model config's path")
    ap.add_argument("--out", required=True, help="output .jsonl or .jsonl.gz")
    ap.add_argument("--num-prompts", type=int, default=100000, help="at most this many prompts (all there are by default)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16, help="prompts per generation batch")
    ap.add_argument("--chunk", type=int, default=64, help="prompts per chunk of the selection order "
                    "(sorted by length into batches inside a chunk)")
    ap.add_argument("--time-budget", type=float, default=0, help="minutes; stop after the chunk that passes it (0 = no limit)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    mcfg = model_config(args)
    template = mcfg.get("chat_template", "auto")
    model, tok = load_model(mcfg, resolve_device(args.device), resolve_dtype(args.dtype))
    eos = set(eos_token_ids(model, tok))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    prompts, stats = select_prompts(args.num_prompts, args.seed)
    print(f"{len(prompts)} prompts ({stats['dropped_for_benchmark_overlap']} candidates dropped for overlap "
          f"with benchmark questions)", flush=True)

    done = {r["id"]: r for r in read_records(out)}
    t0, generated, n_new = time.time(), 0, 0
    for c in range(0, len(prompts), args.chunk):
        if args.time_budget and time.time() - t0 > 60 * args.time_budget:
            print(f"time budget of {args.time_budget} min reached", flush=True)
            break
        todo = [i for i in range(c, min(c + args.chunk, len(prompts))) if i not in done]
        if not todo:
            continue
        encoded = {i: prompt_ids(tok, [{"role": "user", "content": prompts[i]["text"]}], template) for i in todo}
        todo.sort(key=lambda i: len(encoded[i]))
        tc = time.time()
        for b in range(0, len(todo), args.batch_size):
            idx = todo[b:b + args.batch_size]
            for i, (toks, _) in zip(idx, greedy_answers(model, [encoded[i] for i in idx], args.max_new_tokens, eos, pad)):
                ids = [t for t in toks.tolist() if t not in eos]
                done[i] = {"id": i, "source": prompts[i]["source"],
                           "messages": [{"role": "user", "content": prompts[i]["text"]},
                                        {"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)}],
                           "answer_tokens": len(toks)}
                generated += len(toks)
                n_new += 1
        # rewrite in selection order after every chunk: an interrupted run keeps what it made
        tmp = out.with_name(out.name + ".tmp")
        with _open(tmp, "w", gz=out.suffix == ".gz") as f:
            for i in sorted(done):
                f.write(json.dumps(done[i], ensure_ascii=False) + "\n")
        tmp.replace(out)
        el = time.time() - t0
        print(f"  prompts {c}..{c + args.chunk - 1}: {len(todo)} answers in {time.time() - tc:.0f} s; "
              f"{n_new} new answers, {generated} tokens, {el / 60:.1f} min so far", flush=True)
    info = {"prompts_answered": len(done), "new_answers": n_new, "new_answer_tokens": generated,
            "generation_seconds": round(time.time() - t0, 1), "batch_size": args.batch_size,
            "max_new_tokens": args.max_new_tokens, "torch_threads": torch.get_num_threads(),
            "by_source": {}}
    for r in done.values():
        info["by_source"][r["source"]] = info["by_source"].get(r["source"], 0) + 1
    print(json.dumps(info), flush=True)
    return info


if __name__ == "__main__":
    main()

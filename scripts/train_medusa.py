#!/usr/bin/env python
"""Train Medusa-1 heads on a frozen model by self-distillation.

1. prompts: composed offline from sources that are not benchmark questions: Python's own reference
   docs (pydoc_data.topics, as the REST datastore), the docstrings of the standard library's
   modules (read with `ast`, nothing is imported), and templates of our own for the chat categories
   (writing, roleplay, reasoning, math, coding, extraction, stem/humanities, translation,
   summarization, qa, rag). Any prompt sharing an 8-word window with a Spec-Bench question or a
   built-in `mini` prompt is dropped.
2. data: the model's own greedy answers (batched, left padding, the benchmark's chat template),
   recording the last hidden state (after the final norm, lm_head's input) at every answer
   position. Hidden states and tokens are cached on disk per batch, so training epochs, a resumed
   run or another training setting never recompute them.
3. training: the model stays frozen; head k at answer position t predicts the token at t+k+2;
   loss = sum_k 0.8^k CE_k. By default the heads share the model's lm_head (only the ResBlocks are
   trained and saved: a few MB); --own-projection trains a per-head projection initialised from
   lm_head, as the published Medusa-1 heads do.
4. evaluation: per-head top-1 / top-5 accuracy on held-out prompts (a split of the generated data),
   for the trained heads as saved (float16) and for untrained heads (the identity ResBlock, i.e.
   lm_head reading h_t) as the reference.

Examples:
  python scripts/train_medusa.py --model smollm2-135m --out data/medusa/smollm2-135m
  python scripts/train_medusa.py --model vicuna-7b --model-path /models/vicuna-7b-v1.3 \\
      --device cuda --dtype float16 --num-prompts 20000 --max-new-tokens 512 --batch-size 64 \\
      --num-heads 5 --own-projection --epochs 2 --out ~/medusa/vicuna-7b
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

from specbench.inputs.chat import prompt_ids
from specbench.methods.medusa.heads import MedusaHeads, load_heads, save_heads
from specbench.inputs.models import cache_root, eos_token_ids, resolve_dtype
from specbench.tools.training_data import frozen_target, greedy_answers, select_prompts

ROOT = Path(__file__).resolve().parents[1]


HEAD_WEIGHT = 0.8  # loss weight of head k is 0.8^k, as in Medusa's training script
IGNORE = -100

def make_data(args, model, tok, prompts: list[dict], cache_dir: Path) -> dict:
    """Generate (or reuse from the cache) every batch; returns timing and size figures."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    template = args.chat_template
    encoded = [prompt_ids(tok, [{"role": "user", "content": p["text"]}], template) for p in prompts]
    eos = set(eos_token_ids(model, tok))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    # Similar lengths in a batch keep left padding small; order is fixed by the seed.
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    t0, generated = time.time(), 0
    n_batches = math.ceil(len(order) / args.batch_size)
    for b in range(n_batches):
        shard = cache_dir / f"batch_{b:04d}.pt"
        if shard.is_file():
            continue
        idx = order[b * args.batch_size : (b + 1) * args.batch_size]
        tb = time.time()
        answers = greedy_answers(model, [encoded[i] for i in idx], args.max_new_tokens, eos, pad)
        torch.save({"prompt_index": idx, "tokens": [a[0] for a in answers], "hidden": [a[1] for a in answers]},
                   shard)
        n_tok = sum(len(a[0]) for a in answers)
        generated += n_tok
        print(f"  batch {b + 1}/{n_batches}: {n_tok} answer tokens in {time.time() - tb:.0f} s", flush=True)
    return {"generation_seconds": round(time.time() - t0, 1), "tokens_generated_this_run": generated,
            "batches": n_batches}


def load_rows(cache_dir: Path, num_heads: int, held_out: set[int]):
    """Training rows: hidden state at answer position t -> targets for heads 0..K-1 (token t+k+2).
    Split by prompt so held-out prompts never share an answer with training."""
    split = {"train": ([], []), "eval": ([], [])}
    answer_tokens = 0
    for shard in sorted(cache_dir.glob("batch_*.pt")):
        data = torch.load(shard, weights_only=True)
        for p_idx, toks, hid in zip(data["prompt_index"], data["tokens"], data["hidden"]):
            n = len(toks)
            answer_tokens += n
            targets = torch.full((n, num_heads), IGNORE, dtype=torch.long)
            for k in range(num_heads):
                # hid[i] chose toks[i]; head k at row i predicts toks[i + k + 1].
                if n > k + 1:
                    targets[: n - k - 1, k] = toks[k + 1 :].long()
            keep = targets[:, 0] != IGNORE  # rows with no target at all teach nothing
            xs, ys = split["eval" if p_idx in held_out else "train"]
            xs.append(hid[keep])
            ys.append(targets[keep])
    out = {"answer_tokens": answer_tokens}
    for name, (xs, ys) in split.items():
        out[name] = (torch.cat(xs) if xs else torch.empty(0), torch.cat(ys) if ys else torch.empty(0))
    return out


# ---------------------------------------------------------------------------------------------
# 3. training and 4. evaluation


def medusa_loss(heads: MedusaHeads, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    logits = heads(x)  # (K, B, V)
    total, per_head = 0.0, []
    for k in range(heads.num_heads):
        valid = y[:, k] != IGNORE
        if not valid.any():
            per_head.append(float("nan"))
            continue
        ce = torch.nn.functional.cross_entropy(logits[k][valid].float(), y[valid, k])
        total = total + HEAD_WEIGHT**k * ce
        per_head.append(ce.item())
    return total, per_head


def train_heads(heads: MedusaHeads, x: torch.Tensor, y: torch.Tensor, args, device, log) -> list[dict]:
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(x) / args.train_batch_size)
    total = max(1, int(steps_per_epoch * args.epochs)) if args.max_steps is None else args.max_steps
    warmup = max(1, int(0.05 * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    gen = torch.Generator().manual_seed(args.seed)
    amp = device.type == "cuda" or args.amp == "bf16"
    history, step, t0 = [], 0, time.time()
    window: list[tuple[float, list[float]]] = []  # losses since the last log line
    while step < total:
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), args.train_batch_size):
            if step >= total:
                break
            idx = perm[i : i + args.train_batch_size]
            xb = x[idx].to(device=device, dtype=torch.float32)
            yb = y[idx].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                loss, per_head = medusa_loss(heads, xb, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            window.append((loss.item(), per_head))
            if step == 1 or step % args.log_every == 0 or step == total:
                # mean over the steps since the last line: one minibatch alone is noisy
                rec = {"step": step, "loss": round(sum(w[0] for w in window) / len(window), 4),
                       "ce_per_head": [round(sum(w[1][k] for w in window) / len(window), 4)
                                       for k in range(heads.num_heads)],
                       "seconds": round(time.time() - t0, 1)}
                window = []
                history.append(rec)
                log(f"  step {step}/{total}: loss {rec['loss']:.4f} per head {rec['ce_per_head']}")
    return history


@torch.inference_mode()
def head_accuracy(heads: MedusaHeads, x: torch.Tensor, y: torch.Tensor, device, batch: int = 256) -> dict:
    ce = torch.zeros(heads.num_heads)
    correct1 = torch.zeros(heads.num_heads)
    correct5 = torch.zeros(heads.num_heads)
    count = torch.zeros(heads.num_heads)
    for i in range(0, len(x), batch):
        xb = x[i : i + batch].to(device=device, dtype=torch.float32)
        yb = y[i : i + batch].to(device)
        logits = heads(xb)  # (K, B, V)
        top = logits.topk(5, dim=-1).indices
        for k in range(heads.num_heads):
            valid = yb[:, k] != IGNORE
            ce[k] += torch.nn.functional.cross_entropy(logits[k][valid], yb[valid, k], reduction="sum").item()
            hit = top[k][valid] == yb[valid, k, None]
            correct1[k] += hit[:, 0].sum().item()
            correct5[k] += hit.any(-1).sum().item()
            count[k] += valid.sum().item()
    return {"top1": [round(float(c / max(n, 1)), 4) for c, n in zip(correct1, count)],
            "top5": [round(float(c / max(n, 1)), 4) for c, n in zip(correct5, count)],
            "ce": [round(float(c / max(n, 1)), 4) for c, n in zip(ce, count)],
            "rows": [int(n) for n in count]}


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a conf/model/<name>.yaml name")
    ap.add_argument("--model-path", help="override the model config's path (hub id or local directory)")
    ap.add_argument("--out", required=True, help="directory for config.json + medusa_lm_head.safetensors")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32", help="the frozen model's dtype")
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--num-layers", type=int, default=1)
    ap.add_argument("--own-projection", action="store_true",
                    help="train a vocabulary projection per head (published layout) instead of sharing lm_head")
    ap.add_argument("--num-prompts", type=int, default=480)
    ap.add_argument("--held-out", type=float, default=0.1, help="share of prompts kept for evaluation")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per generation batch")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--max-steps", type=int, help="stop after this many optimiser steps (overrides --epochs)")
    ap.add_argument("--train-batch-size", type=int, default=64, help="rows (answer positions) per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--amp", choices=["bf16", "none"], default="bf16",
                    help="bfloat16 autocast for the heads (float32 master weights); always on with CUDA")
    ap.add_argument("--save-dtype", default="float16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--cache-dir", help="default: ~/.cache/specbench/medusa/<model>-<settings hash>")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    t_start = time.time()
    model, tok, mcfg, device = frozen_target(args)
    args.chat_template = mcfg.get("chat_template", "auto")

    prompts, prompt_stats = select_prompts(args.num_prompts, args.seed)
    settings = {"model": args.model, "path": mcfg.get("path"), "dtype": args.dtype, "prompts": [p["text"] for p in prompts],
                "max_new_tokens": args.max_new_tokens, "template": args.chat_template}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    cache_dir = Path(args.cache_dir or cache_root() / "medusa" / f"{args.model}-{key}")
    print(f"{len(prompts)} prompts ({prompt_stats['dropped_for_benchmark_overlap']} candidates dropped for "
          f"overlap with benchmark questions); data cache {cache_dir}", flush=True)
    (cache_dir).mkdir(parents=True, exist_ok=True)
    (cache_dir / "prompts.json").write_text(json.dumps(prompts, indent=1))
    gen_stats = make_data(args, model, tok, prompts, cache_dir)

    rng = random.Random(args.seed + 1)
    held_out = set(rng.sample(range(len(prompts)), max(1, int(args.held_out * len(prompts)))))
    rows = load_rows(cache_dir, args.num_heads, held_out)
    (x_train, y_train), (x_eval, y_eval) = rows["train"], rows["eval"]
    print(f"rows: {len(x_train)} train, {len(x_eval)} held-out", flush=True)

    lm_head = model.get_output_embeddings().weight.detach()
    hidden, vocab = lm_head.shape[1], lm_head.shape[0]
    heads = MedusaHeads(args.num_heads, hidden, vocab, args.num_layers, shared_projection=not args.own_projection)
    heads.to(device)
    if args.own_projection:
        heads.init_projections_from(lm_head.float())
    else:
        heads.set_shared_projection(lm_head.float() if lm_head.dtype != torch.float32 else lm_head)
    untrained = head_accuracy(heads, x_eval, y_eval, device)
    print(f"untrained heads (identity ResBlock) held-out top-1 {untrained['top1']}", flush=True)

    t_train = time.time()
    history = train_heads(heads, x_train, y_train, args, device, lambda m: print(m, flush=True))
    train_seconds = time.time() - t_train

    info = {
        "command": "python scripts/train_medusa.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "base_model": args.model, "base_model_path": mcfg.get("path"), "dtype": args.dtype, "device": str(device),
        "prompt_sources": "Python's pydoc_data.topics, stdlib module docstrings (read with ast), composed "
                          "templates (specbench/tools/training_data.py); none overlaps Spec-Bench or the mini prompts",
        "prompts": prompt_stats, "held_out_prompts": len(held_out),
        "max_new_tokens": args.max_new_tokens, "answer_tokens": rows["answer_tokens"],
        "train_rows": int(len(x_train)), "eval_rows": int(len(x_eval)),
        "epochs": args.epochs, "steps": history[-1]["step"] if history else 0, "train_batch_size": args.train_batch_size,
        "lr": args.lr, "amp": args.amp, "loss": "sum_k 0.8^k CE(head k, token t+k+2)",
        "first_loss": history[0] if history else None, "final_loss": history[-1] if history else None,
        "history": history, "generation": gen_stats,
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    out = save_heads(heads, args.out, resolve_dtype(args.save_dtype), base_model=args.model,
                     base_model_name_or_path=mcfg.get("path") or args.model)
    # Evaluate what was saved (float16 weights), reading it back as the drafter will.
    saved = load_heads(out).to(device)
    if saved.shared_projection:
        saved.set_shared_projection(lm_head.float() if lm_head.dtype != torch.float32 else lm_head)
    info["held_out_accuracy"] = {"trained": head_accuracy(saved, x_eval, y_eval, device), "untrained": untrained}
    (Path(out) / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"held-out top-1 per head: trained {info['held_out_accuracy']['trained']['top1']} "
          f"(untrained {untrained['top1']}); wrote {out}", flush=True)
    return info


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Train an EAGLE draft head (specbench/methods/eagle/head.py) for a frozen model on its own answers.

1. data: a self-distilled chat corpus, the model's greedy answers to prompts that are in no benchmark
   (scripts/make_rest_corpus.py makes it from the head trainers' prompts, specbench/tools/training_data.py; the embedded model's ships
   as data/rest/corpora/smollm2-135m-selfdistil.jsonl.gz). Each conversation is tokenised as the
   benchmark prompts it (chat template), its answer appended, and one teacher-forced forward gives
   the target's features f_t (last hidden state after the final norm) at every position.
2. training, as EAGLE publishes it: the head reads (f_t + uniform noise, embed(x_{t+1})) and predicts
   f_{t+1}; loss = SmoothL1(prediction, f_{t+1}) + 0.1 * CE(softmax(lm_head(f_{t+1})), lm_head(prediction)),
   on answer positions only. Several conversations share a batch, each attending only to itself.
3. evaluation: top-1 / top-5 accuracy of lm_head(prediction) against the target's own next token
   (argmax lm_head(f_{t+1})) on held-out conversations (a split by prompt), for the saved head.

Example (the embedded model's head, data/eagle/smollm2-135m):
  python scripts/train_eagle.py --model smollm2-135m --out data/eagle/smollm2-135m --epochs 4 --threads 2
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import sys
import time
from pathlib import Path

import torch

from specbench.inputs.chat import prompt_ids
from specbench.inputs.models import cache_root, resolve_dtype
from specbench.methods.eagle.head import EagleHead, HeadConfig, load_head, save_head
from specbench.tools.training_data import frozen_target

ROOT = Path(__file__).resolve().parents[1]

FEATURE_WEIGHT, TOKEN_WEIGHT = 1.0, 0.1  # EAGLE's v_w and p_w
NOISE = 0.1  # uniform noise U(-0.1, 0.1) on the input features, as in EAGLE's paper


def conversations(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


@torch.inference_mode()
def featurise(model, tok, convs: list[dict], template: str) -> list[dict]:
    """Per conversation: token ids, the target's features at every position, where the answer starts."""
    out = []
    for c in convs:
        user = [m for m in c["messages"] if m["role"] == "user"]
        answer = next(m["content"] for m in c["messages"] if m["role"] == "assistant")
        prompt = prompt_ids(tok, user[:1], template)
        ids = prompt + tok(answer, add_special_tokens=False).input_ids
        hidden = model.model(input_ids=torch.tensor([ids], device=model.device)).last_hidden_state[0]
        out.append({"id": c.get("id"), "ids": torch.tensor(ids), "features": hidden.float().cpu(),
                    "answer_start": len(prompt)})
    return out


def batches(items: list[dict], max_rows: int, rng: random.Random | None):
    """Groups of conversations of at most max_rows rows (one conversation may exceed it alone)."""
    order = list(range(len(items)))
    if rng is not None:
        rng.shuffle(order)
    group, rows = [], 0
    for i in order:
        n = len(items[i]["ids"]) - 1
        if group and rows + n > max_rows:
            yield [items[j] for j in group]
            group, rows = [], 0
        group.append(i)
        rows += n
    if group:
        yield [items[j] for j in group]


def batch_tensors(group: list[dict], embed, device):
    """Rows t = 0 .. n-2 of each conversation: inputs (f_t, embed(x_{t+1})), target f_{t+1}; a
    block-diagonal causal mask; the answer rows (those whose target is an answer position)."""
    feats, ids, targets, pos, masks, spans = [], [], [], [], [], []
    for item in group:
        n = len(item["ids"]) - 1
        feats.append(item["features"][:-1])
        targets.append(item["features"][1:])
        ids.append(item["ids"][1:])
        pos.append(torch.arange(n))
        masks.append(torch.arange(1, n + 1) >= item["answer_start"])
        spans.append(n)
    total = sum(spans)
    visible = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for n in spans:
        visible[start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        start += n
    with torch.no_grad():
        embeds = embed(torch.cat(ids).to(device)).float()
    return (torch.cat(feats).to(device), embeds, torch.cat(pos).to(device), visible.to(device),
            torch.cat(targets).to(device), torch.cat(masks).to(device))


def losses(head: EagleHead, lm_head: torch.Tensor, batch, noise: float, token_rows: float = 1.0):
    """(feature loss, token loss, head logits, target's tokens) on the answer rows; the token loss (a
    vocabulary projection per row, most of a step's time) on a random `token_rows` share of them."""
    feats, embeds, pos, visible, target, answer = batch
    if noise:
        feats = feats + (torch.rand_like(feats) * 2 - 1) * noise
    pred, _ = head(feats, embeds, pos, visible)
    pred, target = pred[answer], target[answer]
    feature_loss = torch.nn.functional.smooth_l1_loss(pred, target)
    if token_rows < 1.0:
        pick = torch.randperm(len(pred), device=pred.device)[: max(1, int(token_rows * len(pred)))]
        pred, target = pred[pick], target[pick]
    with torch.no_grad():
        target_p = torch.softmax(target @ lm_head.T, dim=-1)
    logits = pred @ lm_head.T
    token_loss = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    return feature_loss, token_loss, logits.detach(), target_p.argmax(-1)


@torch.no_grad()
def accuracy(head: EagleHead, lm_head, items, embed, device, max_rows: int) -> dict:
    hit1 = hit5 = rows = 0
    for group in batches(items, max_rows, None):
        _, _, logits, wanted = losses(head, lm_head, batch_tensors(group, embed, device), 0.0)
        top5 = logits.topk(5, dim=-1).indices
        hit1 += int((top5[:, 0] == wanted).sum())
        hit5 += int((top5 == wanted[:, None]).any(-1).sum())
        rows += len(wanted)
    return {"top1": round(hit1 / max(rows, 1), 4), "top5": round(hit5 / max(rows, 1), 4), "rows": rows}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a conf/model/<name>.yaml name")
    ap.add_argument("--model-path", help="override the model config's path (hub id or local directory)")
    ap.add_argument("--conversations", help="self-distilled corpus (.jsonl or .jsonl.gz of chat messages); "
                    "default data/rest/corpora/<model>-selfdistil.jsonl.gz")
    ap.add_argument("--out", required=True, help="directory for config.json + model.safetensors")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32", help="the frozen model's dtype for the features")
    ap.add_argument("--limit", type=int, help="the first N conversations only (a quick check)")
    ap.add_argument("--held-out", type=float, default=0.1, help="share of conversations kept for evaluation")
    ap.add_argument("--epochs", type=float, default=4.0)
    ap.add_argument("--batch-rows", type=int, default=2048, help="rows (positions) per optimiser step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--noise", type=float, default=NOISE)
    ap.add_argument("--token-rows", type=float, default=1.0,
                    help="share of a batch's answer rows that enter the token loss (1.0: all, as published; "
                         "less trains faster where the vocabulary projection dominates, as on a CPU)")
    ap.add_argument("--save-dtype", default="float16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    t_start = time.time()
    corpus = Path(args.conversations or ROOT / "data/rest/corpora" / f"{args.model}-selfdistil.jsonl.gz")
    if not corpus.is_file():
        raise SystemExit(f"error: no corpus {corpus}; make one with python scripts/make_rest_corpus.py "
                         f"--model {args.model} --out {corpus}, or pass --conversations FILE")
    model, tok, mcfg, device = frozen_target(args)
    convs = conversations(corpus)[: args.limit]
    rng = random.Random(args.seed)
    held = set(rng.sample(range(len(convs)), max(1, int(args.held_out * len(convs)))))
    t0 = time.time()
    key = hashlib.sha256(json.dumps([mcfg.get("path"), args.model, args.dtype, str(corpus), corpus.stat().st_size,
                                     len(convs)]).encode()).hexdigest()[:12]
    cached = cache_root() / "eagle" / f"{args.model}-{key}.pt"
    if cached.is_file():  # features of the same corpus and model: another training setting reuses them
        items = torch.load(cached, weights_only=True)
        items = [{**x, "features": x["features"].float()} for x in items]
    else:
        items = featurise(model, tok, convs, mcfg.get("chat_template", "auto"))
        cached.parent.mkdir(parents=True, exist_ok=True)
        torch.save([{**x, "features": x["features"].half()} for x in items], cached)
    feature_seconds = time.time() - t0
    train = [x for i, x in enumerate(items) if i not in held]
    evaluation = [x for i, x in enumerate(items) if i in held]
    print(f"{len(train)} training and {len(evaluation)} held-out conversations; features in "
          f"{feature_seconds:.0f} s", flush=True)

    embed = model.get_input_embeddings()
    lm_head = model.get_output_embeddings().weight.detach().float()
    config = HeadConfig.for_target(model.config)
    head = EagleHead(config).to(device)
    untrained = accuracy(head, lm_head, evaluation, embed, device, args.batch_rows)
    steps_per_epoch = sum(1 for _ in batches(train, args.batch_rows, None))
    total_steps = max(1, int(args.epochs * steps_per_epoch))
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=total_steps, pct_start=0.05)
    history, step, t_train = [], 0, time.time()
    batch_rng = random.Random(args.seed + 1)
    while step < total_steps:
        for group in batches(train, args.batch_rows, batch_rng):
            fl, tl, _, _ = losses(head, lm_head, batch_tensors(group, embed, device), args.noise, args.token_rows)
            loss = FEATURE_WEIGHT * fl + TOKEN_WEIGHT * tl
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            opt.step()
            sched.step()
            step += 1
            if step % 20 == 0 or step in (1, total_steps):
                history.append({"step": step, "feature_loss": round(fl.item(), 4), "token_loss": round(tl.item(), 4),
                                "seconds": round(time.time() - t_train, 1)})
                print(history[-1], flush=True)
            if step >= total_steps:
                break
    train_seconds = time.time() - t_train

    out = save_head(head, args.out, resolve_dtype(args.save_dtype), base_model=args.model)
    saved = load_head(out, embed.weight).to(device)  # evaluate what was written, read back as the drafter does
    info = {
        "command": "python scripts/train_eagle.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "base_model": args.model, "dtype": args.dtype, "device": str(device), "corpus": str(corpus.relative_to(ROOT))
        if corpus.is_relative_to(ROOT) else str(corpus),
        "conversations": {"train": len(train), "held_out": len(evaluation)},
        "rows": {"train": sum(int((torch.arange(1, len(x["ids"])) >= x["answer_start"]).sum()) for x in train)},
        "loss": "SmoothL1(feature) + 0.1 * CE(target distribution, head logits), answer rows, input noise U(-0.1, 0.1)",
        "token_rows": args.token_rows,
        "epochs": args.epochs, "steps": step, "batch_rows": args.batch_rows, "lr": args.lr,
        "feature_seconds": round(feature_seconds, 1), "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.time() - t_start, 1), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "history": history,
        "held_out_top1_of_next_token": {"trained": accuracy(saved.float(), lm_head, evaluation, embed, device,
                                                            args.batch_rows), "untrained": untrained},
    }
    (Path(out) / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"held-out accuracy {info['held_out_top1_of_next_token']}; wrote {out}", flush=True)
    return info


if __name__ == "__main__":
    main()

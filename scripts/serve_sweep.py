#!/usr/bin/env python
"""Speculative decoding under concurrent requests: a batch-size sweep and a request-rate sweep.

Each Spec-Bench question's first turn is one request (greedy). For every method and speculation
policy (`fixed`: each drafter's whole draft; `goodput`: the batch row budget with the best expected
tokens per second on the measured t(B, R), hardware/batch_goodput.py), decodes
  - a closed batch: every request waiting at t = 0, at most B decoded together (continuous batching);
  - an open load: Poisson arrivals at each rate (seeded), at most --rate-batch together;
on the batched eager forward (decoding/batched.py), and records throughput (new tokens per second of
the whole run), per-request latency (finish - arrival: mean, p50, p99), time per output token after
the first, MAT, and losslessness: every request's tokens against its own batch-size-1 AR output
(exact in float32; a differing token is checked against the target's choice within the rounding
band, benchmark/lossless.py). Speedups are against batched AR at the same B or rate (the same
invocation, unless a resumed sweep split them). A line per configuration is appended to
OUT/results.jsonl as it finishes; a rerun skips the ones there. Then OUT/tables.md and
OUT/plots/{speedup_vs_batch,latency_vs_rate}.png.

Example (the CPU sweep in results/cpu-batched):
  python scripts/serve_sweep.py --questions ../shared/data/spec_bench/question.jsonl --per-subtask 2 \\
      --max-new-tokens 128 --out results/cpu-batched
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specbench.benchmark import lossless  # noqa: E402
from specbench.benchmark.results import append_jsonl, read_jsonl, repair_jsonl  # noqa: E402
from specbench.benchmark.serving import poisson_arrivals, serving_figures  # noqa: E402
from specbench.decoding.batched import BatchedEngine, Request  # noqa: E402
from specbench.decoding.engine import Engine  # noqa: E402
from specbench.hardware.batch_goodput import BatchCost, BatchGoodput, FixedSpeculation, measure_batch_cost  # noqa: E402
from specbench.hardware.cost import CostCurve  # noqa: E402
from specbench.inputs.chat import prompt_ids  # noqa: E402
from specbench.inputs.models import eos_token_ids, load_model, named_model_config  # noqa: E402
from specbench.inputs.tasks import load_jsonl_questions, select_per_subtask  # noqa: E402
from specbench.registry import build_drafter  # noqa: E402


def drafter_factory(method: str, model, cost: BatchCost):
    vocab = model.get_output_embeddings().weight.shape[0]
    # tr_fused/tr_adaptive choose their own trees from a batch-1 curve: the batched forward's at B = 1
    curve = CostCurve(widths=cost.rows, times=cost.times[cost.batches.index(1)] if 1 in cost.batches else cost.times[0])
    first = []

    def make():
        d = build_drafter(method, vocab_size=vocab, model=model, device=model.device,
                          model_name="smollm2-135m", dtype_name="float32", hardware_curve=curve)
        if first:  # what the method learns across requests (TR's matrix) is one state for the batch
            d.share_learned_state(first[0])
        else:
            first.append(d)
        return d

    return make


def run_config(engine, model, prompts, refs, args, method, policy_name, cost, max_batch, arrivals):
    policy = BatchGoodput(cost) if policy_name == "goodput" else FixedSpeculation()
    make = drafter_factory(method, model, cost)
    requests = [Request(p, args.max_new_tokens, make, None, a) for p, a in zip(prompts, arrivals)]
    result = engine.generate(requests, max_batch, policy)
    exact = sum(r.tokens == ref for r, ref in zip(result.records, refs))
    outside = 0
    for r, p, ref in zip(result.records, prompts, refs):
        if r.tokens != ref:  # judged token by token against the target's own choices
            c = lossless.check_tokens(model, {"turns": [{"prompt_ids": p, "token_ids": r.tokens}]}, "float32")
            outside += c["tokens_outside_band"]
    return {**serving_figures(result), "exact_vs_ar": exact, "tokens_outside_band": outside}


def run_single(single: Engine, model, prompts, refs, args, method, cost) -> dict:
    """Today's single-request engine on the same requests one after another: what batched B = 1 must equal."""
    make = drafter_factory(method, model, cost)
    results = []
    t0 = time.perf_counter()
    for p in prompts:
        results.append(single.generate(p, make(), args.max_new_tokens))
    wall = time.perf_counter() - t0
    tokens = sum(r.new_tokens for r in results)
    steps = sum(len(r.accept_lengths) for r in results)
    return {"tokens": tokens, "wall_s": round(wall, 3), "throughput": round(tokens / wall, 2),
            "mat": round(sum(sum(r.accept_lengths) for r in results) / max(steps, 1), 3),
            "requests": len(results), "exact_vs_ar": sum(r.tokens == ref for r, ref in zip(results, refs))}


def tables(rows: list[dict]) -> str:
    out = ["# Batched decoding sweep", "", "Speedup: throughput over batched AR's at the same batch size or rate, "
           "as results.jsonl holds them (each line's `finished` says when it ran: lines of different invocations "
           "compare across processes). Latency: finish - arrival, seconds.", ""]
    closed = [r for r in rows if r["load"] == "closed"]
    if closed:
        out += ["## Closed batch (every request waiting at t = 0)", "",
                "| method | policy | B | tok/s | speedup | MAT | rows/step | latency p50 | p99 | TPOT ms | lossless |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        ar = {r["batch"]: r["throughput"] for r in closed if r["method"] == "ar"}
        for r in sorted(closed, key=lambda r: (r["method"] != "ar", r["method"], r["policy"], r["batch"])):
            sp = r["throughput"] / ar[r["batch"]] if r["batch"] in ar else float("nan")
            out.append(f"| {r['method']} | {r['policy']} | {r['batch']} | {r['throughput']:.1f} | {sp:.2f}x | "
                       f"{r['mat']:.2f} | {r['rows_per_step']} | {r['latency_p50']:.1f} | {r['latency_p99']:.1f} | "
                       f"{r['tpot_ms']} | {r['exact_vs_ar']}/{r['requests']} exact, {r['tokens_outside_band']} outside |")
    single = [r for r in rows if r["load"] == "single"]
    batch1 = {r["method"]: r for r in closed if r["batch"] == 1 and r["policy"] == "fixed"}
    if single:
        out += ["", "## Batch size 1 against the single-request engine", "",
                "The same requests one after another through `Engine.generate` (the engine behind run.py, eager "
                "forward) and through the batched engine at B = 1 with fixed speculation.", "",
                "| method | single-request tok/s | MAT | batched B = 1 tok/s | MAT | batched / single | lossless (single) |",
                "|---|---:|---:|---:|---:|---:|---|"]
        for r in sorted(single, key=lambda r: (r["method"] != "ar", r["method"])):
            b = batch1.get(r["method"])
            bt = f"{b['throughput']:.1f} | {b['mat']:.2f} | {b['throughput'] / r['throughput']:.2f}" if b else "- | - | -"
            out.append(f"| {r['method']} | {r['throughput']:.1f} | {r['mat']:.2f} | {bt} | "
                       f"{r['exact_vs_ar']}/{r['requests']} exact |")
    opened = [r for r in rows if r["load"] == "poisson"]
    if opened:
        out += ["", "## Poisson arrivals", "",
                "| method | policy | rate (req/s) | max batch | tok/s | latency mean | p50 | p99 | speedup (latency) | lossless |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        ar = {r["rate"]: r["latency_mean"] for r in opened if r["method"] == "ar"}
        for r in sorted(opened, key=lambda r: (r["method"] != "ar", r["method"], r["policy"], r["rate"])):
            sp = ar.get(r["rate"], float("nan")) / r["latency_mean"]
            out.append(f"| {r['method']} | {r['policy']} | {r['rate']} | {r['batch']} | {r['throughput']:.1f} | "
                       f"{r['latency_mean']:.1f} | {r['latency_p50']:.1f} | {r['latency_p99']:.1f} | {sp:.2f}x | "
                       f"{r['exact_vs_ar']}/{r['requests']} exact, {r['tokens_outside_band']} outside |")
    return "\n".join(out) + "\n"


def speedup_plot(plt, closed: list[dict], ar: dict, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in sorted({(r["method"], r["policy"]) for r in closed if r["method"] != "ar"}):
        pts = sorted((r["batch"], r["throughput"] / ar[r["batch"]]) for r in closed
                     if (r["method"], r["policy"]) == key and r["batch"] in ar)
        ax.plot(*zip(*pts), marker="o", linestyle="-" if key[1] == "goodput" else "--", label=f"{key[0]} ({key[1]})")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B (closed batch)")
    ax.set_ylabel("throughput / batched AR's")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "speedup_vs_batch.png", dpi=120)


def plots(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    closed = [r for r in rows if r["load"] == "closed"]
    ar = {r["batch"]: r["throughput"] for r in closed if r["method"] == "ar"}
    if closed:
        speedup_plot(plt, closed, ar, out)
    opened = [r for r in rows if r["load"] == "poisson"]
    if opened:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key in sorted({(r["method"], r["policy"]) for r in opened}):
            pts = sorted((r["rate"], r["latency_mean"]) for r in opened if (r["method"], r["policy"]) == key)
            ax.plot(*zip(*pts), marker="o", linestyle="-" if key[1] == "goodput" else "--",
                    label=key[0] if key[0] == "ar" else f"{key[0]} ({key[1]})")
        ax.set_xlabel("request rate (requests / s, Poisson)")
        ax.set_ylabel("mean latency (s)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "latency_vs_rate.png", dpi=120)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--per-subtask", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default="ar,tr,tr_fused,pld")
    ap.add_argument("--policies", default="fixed,goodput")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--single-methods", default="ar,tr,tr_fused,pld",
                    help="also run these through the single-request engine (the B = 1 check); empty: none")
    ap.add_argument("--rates", default="", help="Poisson request rates (requests/s), e.g. 0.5,1,2; empty: none")
    ap.add_argument("--rate-batch", type=int, default=16, help="at most this many decoded together under arrivals")
    ap.add_argument("--cost", help="a batch cost JSON (measure_batch_cost); default OUT/batch_cost.json, measured if missing")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), torch.float32)
    eos = eos_token_ids(model, tok)
    questions = select_per_subtask(load_jsonl_questions(args.questions), args.per_subtask)
    prompts = [prompt_ids(tok, [{"role": "user", "content": q.turns[0]}]) for q in questions]
    cost_path = Path(args.cost) if args.cost else out / "batch_cost.json"
    if not cost_path.is_file():
        print("measuring t(B, R) on the batched forward", flush=True)
        measure_batch_cost(model).save(cost_path)
    cost = BatchCost.load(cost_path)
    # every request's reference: AR alone (batch size 1, the single-request engine)
    single = Engine(model, eos)
    refs = [single.generate(p, build_drafter("ar"), args.max_new_tokens).tokens for p in prompts]
    engine = BatchedEngine(model, eos)
    results = out / "results.jsonl"
    done = {(r["load"], r["method"], r["policy"], r["batch"], r.get("rate")) for r in repair_jsonl(results)}
    methods = args.methods.split(",")
    configs = [("single", m, "fixed", 1, None) for m in filter(None, args.single_methods.split(","))]
    configs += [("closed", m, pol, b, None) for b in map(int, filter(None, args.batches.split(",")))
               for m in methods for pol in (["fixed"] if m == "ar" else args.policies.split(","))]
    configs += [("poisson", m, pol, args.rate_batch, float(r)) for r in filter(None, args.rates.split(","))
                for m in methods for pol in (["fixed"] if m == "ar" else args.policies.split(","))]
    for load, method, policy, batch, rate in configs:
        if (load, method, policy, batch, rate) in done:
            continue
        arrivals = poisson_arrivals(len(prompts), rate, args.seed)
        t0 = time.time()
        if load == "single":
            figures = run_single(single, model, prompts, refs, args, method, cost)
        else:
            figures = run_config(engine, model, prompts, refs, args, method, policy, cost, batch, arrivals)
        row = {"load": load, "method": method, "policy": policy, "batch": batch, "rate": rate, **figures,
               "max_new_tokens": args.max_new_tokens, "questions": len(prompts), "seed": args.seed,
               "torch_threads": torch.get_num_threads(), "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        append_jsonl(results, row)
        print(f"{load} {method} {policy} B={batch} rate={rate}: {figures['throughput']} tok/s, MAT {figures['mat']}, "
              f"{figures['exact_vs_ar']}/{len(prompts)} exact ({time.time() - t0:.0f} s)", flush=True)
    rows = read_jsonl(results)
    (out / "tables.md").write_text(tables(rows))
    plots(rows, out / "plots")
    print((out / "tables.md").read_text())


if __name__ == "__main__":
    main()

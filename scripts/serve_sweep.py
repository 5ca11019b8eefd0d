#!/usr/bin/env python
"""Speculative decoding under concurrent requests: a batch-size sweep and a request-rate sweep.

Each Spec-Bench question's first turn is one request (greedy). For every method and speculation
policy (`fixed`: each drafter's whole draft; `goodput`: the batch row budget with the best expected
tokens per second on the measured t(B, R), speculation/batch_policy.py), decodes
  - a closed batch: every request waiting at t = 0, at most B decoded together (continuous batching);
  - an open load: Poisson arrivals at each rate (seeded), at most --rate-batch together;
on the batched eager forward (decoding/batched.py), and records throughput (new tokens per second of
the whole run), per-request latency (finish - arrival: mean, p50, p99), time per output token after
the first, MAT, and losslessness: every request's tokens against its own batch-size-1 AR output
(exact in float32; a differing token is checked against the target's choice within the rounding
band, run/lossless.py). Speedups are against batched AR at the same B or rate (the same
invocation, unless a resumed sweep split them). With --repeats N every configuration runs N times,
round by round (AR and each method and policy at one B next to each other, in reverse order every
other round), and a speedup is the mean of each
round's ratio to the same round's AR, the rounds' range beside it: this CPU's speed drifts by ~10%
within minutes, so only ratios taken close together, and repeated, separate policies. A line per
configuration and round is appended to OUT/results.jsonl as it finishes; a rerun skips the ones
there. Then OUT/tables.md and OUT/plots/{speedup_vs_batch,latency_vs_rate}.png.

Example (the CPU sweep in results/cpu-batched):
  python scripts/serve_sweep.py --questions ../shared/data/spec_bench/question.jsonl --per-subtask 2 \\
      --max-new-tokens 128 --out results/cpu-batched
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from specbench.run import lossless
from specbench.run.results_io import append_jsonl, read_jsonl, repair_jsonl
from specbench.run.metrics import mean_interval_95
from specbench.run.serving_metrics import poisson_arrivals, serving_figures
from specbench.decoding.batched import BatchedEngine, DrafterPool, Request
from specbench.decoding.engine import Engine
from specbench.speculation.batch_policy import (BatchCost, BatchGoodput, FixedSpeculation, measure_batch_cost)
from specbench.speculation.cost import CostCurve
from specbench.run.host_memory import HOST_MEMORY, apply_host_memory
from specbench.inputs.chat import prompt_ids
from specbench.inputs.models import eos_token_ids, load_model, named_model_config
from specbench.inputs.tasks import load_jsonl_questions, select_per_subtask
from specbench.registry import build_drafter

ROOT = Path(__file__).resolve().parents[1]


def drafter_pool(method: str, model, cost: BatchCost) -> DrafterPool:
    """Drafters for one configuration's requests: built at most B times, TR's matrix one for all."""
    vocab = model.get_output_embeddings().weight.shape[0]
    # tr_fused/tr_adaptive choose their own trees from a batch-1 curve: the batched forward's at B = 1
    curve = CostCurve(widths=cost.rows, times=cost.times[cost.batches.index(1)] if 1 in cost.batches else cost.times[0])
    return DrafterPool(lambda: build_drafter(method, vocab_size=vocab, model=model, device=model.device,
                                             model_name="smollm2-135m", dtype_name="float32", hardware_curve=curve))


def run_config(engine, model, prompts, refs, args, method, policy_name, cost, max_batch, arrivals):
    policy = BatchGoodput(cost) if policy_name == "goodput" else FixedSpeculation()
    pool = drafter_pool(method, model, cost)
    requests = [Request(p, args.max_new_tokens, pool, None, a) for p, a in zip(prompts, arrivals, strict=True)]
    result = engine.generate(requests, max_batch, policy)
    margin = {"min_gain": policy.min_gain} if isinstance(policy, BatchGoodput) else {}
    return {**serving_figures(result), **judge(model, prompts, [r.tokens for r in result.records], refs), **margin}


def judge(model, prompts, outputs, refs) -> dict:
    """Each output against its AR reference: exact, or judged token by token against the target's own
    choices (float32). A mismatch: a token outside the band, or one side stopping where the other goes
    on with the same tokens (a length difference is never exact), or a request without an output."""
    if not (len(prompts) == len(outputs) == len(refs)):  # a request lost or added: every one counts as failed
        return {"exact_vs_ar": 0, "tokens_outside_band": 0, "mismatches": max(len(prompts), len(outputs), len(refs))}
    exact = outside = mismatches = 0
    for p, tokens, ref in zip(prompts, outputs, refs, strict=True):
        if tokens == ref:
            exact += 1
            continue
        c = lossless.check_tokens(model, {"turns": [{"prompt_ids": p, "token_ids": tokens}]}, "float32")
        outside += c["tokens_outside_band"]
        cut = lossless.first_divergence(tokens, ref) == min(len(tokens), len(ref))  # same tokens, one stops early
        mismatches += bool(c["tokens_outside_band"] or cut)
    return {"exact_vs_ar": exact, "tokens_outside_band": outside, "mismatches": mismatches}


def failures(rows: list[dict]) -> list[str]:
    """The rows that fail the lossless check: a token outside the band, a mismatch, a request missing."""
    bad = []
    for r in rows:
        missing = r.get("questions", r.get("requests", 0)) - r.get("requests", r.get("questions", 0))
        if r.get("tokens_outside_band") or r.get("mismatches") or missing:
            bad.append(f"{r['load']} {r['method']} {r['policy']} B={r['batch']} rate={r.get('rate')} round "
                       f"{r.get('round', 1)}: {r.get('mismatches', 0)} mismatch(es), {r.get('tokens_outside_band', 0)} "
                       f"token(s) outside the band, {missing} request(s) missing")
    return bad


def run_single(single: Engine, model, prompts, refs, args, method, cost) -> dict:
    """Today's single-request engine on the same requests one after another: what batched B = 1 must equal."""
    make = drafter_pool(method, model, cost)  # a fresh drafter per request, sharing TR's matrix
    results = []
    t0 = time.perf_counter()
    for p in prompts:
        results.append(single.generate(p, make(), args.max_new_tokens))
    wall = time.perf_counter() - t0
    tokens = sum(r.new_tokens for r in results)
    steps = sum(len(r.accept_lengths) for r in results)
    return {"tokens": tokens, "wall_s": round(wall, 3), "throughput": round(tokens / wall, 2),
            "mat": round(sum(sum(r.accept_lengths) for r in results) / max(steps, 1), 3),
            "requests": len(results), **judge(model, prompts, [r.tokens for r in results], refs)}


def schedule(configs: list[tuple], repeats: int, first: int = 1) -> list[tuple]:
    """(round, *config) in run order: rounds first..repeats, the single-request runs in round 1 only.
    Within a round the configurations of one load and batch size (or rate) stay together, AR among
    them, in reverse order every other round: the machine's drift over a few minutes then favours no
    method. A later `first` adds rounds to a sweep without running its earlier rounds' new
    configurations, which would have no AR beside them."""
    out = []
    for k in range(first, repeats + 1):
        groups: dict = {}
        for c in configs:
            if k == 1 or c[0] != "single":
                groups.setdefault((c[0], c[3], c[4]), []).append(c)
        for group in groups.values():
            out += [(k, *c) for c in (group if k % 2 else group[::-1])]
    return out


def combine(rows: list[dict], load: str) -> list[dict]:
    """One entry per configuration of `load` over its rounds: mean figures, lossless tallies summed, and
    its speedup over AR as the mean of each round's ratio to that round's AR (throughput at a batch
    size; mean latency under arrivals), with the rounds' lowest and highest ratio."""
    rows = [r for r in rows if r["load"] == load]
    where = "batch" if load != "poisson" else "rate"
    ar = {(r[where], r.get("round", 1)): r for r in rows if r["method"] == "ar"}

    def ratio(r):
        base = ar.get((r[where], r.get("round", 1)))
        if base is None:
            return None
        return r["throughput"] / base["throughput"] if load != "poisson" else base["latency_mean"] / r["latency_mean"]

    groups: dict = {}
    for r in rows:
        groups.setdefault((r["method"], r["policy"], r["batch"], r.get("rate")), []).append(r)
    out = []
    for (method, policy, batch, rate), rs in groups.items():
        mean = lambda k: statistics.mean(r[k] for r in rs)  # noqa: E731
        ratios = [x for x in map(ratio, rs) if x is not None]
        out.append({"method": method, "policy": policy, "batch": batch, "rate": rate, "rounds": len(rs),
                    "throughput": mean("throughput"), "mat": mean("mat"), "rows_per_step": mean("rows_per_step"),
                    "latency_mean": mean("latency_mean"), "latency_p50": mean("latency_p50"),
                    "latency_p99": mean("latency_p99"),
                    "tpot_ms": statistics.mean(r["tpot_ms"] for r in rs) if all(r["tpot_ms"] for r in rs) else None,
                    "speedup": statistics.mean(ratios) if ratios else float("nan"),
                    "low": min(ratios, default=float("nan")), "high": max(ratios, default=float("nan")),
                    "ci95": mean_interval_95(ratios),
                    "exact_vs_ar": sum(r["exact_vs_ar"] for r in rs), "requests": sum(r["requests"] for r in rs),
                    "tokens_outside_band": sum(r["tokens_outside_band"] for r in rs),
                    "mismatches": sum(r.get("mismatches", 0) for r in rs)})
    return sorted(out, key=lambda r: (r["method"] != "ar", r["method"], r["policy"], r["batch"], r["rate"] or 0))


def mismatch_note(r: dict) -> str:
    return f", {r['mismatches']} MISMATCH(ES)" if r.get("mismatches") else ""


def speedup_cell(r: dict) -> str:
    if r["rounds"] < 2 or r["method"] == "ar":
        return f"{r['speedup']:.2f}x"
    return f"{r['speedup']:.2f}x ({r['low']:.2f}-{r['high']:.2f})"


def interval_cell(r: dict) -> str:
    return "-" if r["method"] == "ar" or r["ci95"] is None else f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}"


def tables(rows: list[dict]) -> str:
    out = ["# Batched decoding sweep", "", "Speedup: throughput over batched AR's at the same batch size or rate, "
           "the mean of each round's ratio to the same round's AR, with the rounds' range in brackets when a "
           "configuration ran more than once (`round` in results.jsonl; each line's `finished` says when it ran), "
           "and the 95% confidence interval of that mean (Student's t over the rounds): where it holds 1, the "
           "rounds do not tell the method from AR. "
           "Figures: means over rounds; lossless: tallies over rounds. Latency: finish - arrival, seconds.", ""]
    closed = combine(rows, "closed")
    if closed:
        out += ["## Closed batch (every request waiting at t = 0)", "",
                "| method | policy | B | rounds | tok/s | speedup | 95% CI | MAT | rows/step | latency p50 | p99 | TPOT ms | lossless |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in closed:
            out.append(f"| {r['method']} | {r['policy']} | {r['batch']} | {r['rounds']} | {r['throughput']:.1f} | "
                       f"{speedup_cell(r)} | {interval_cell(r)} | {r['mat']:.2f} | {r['rows_per_step']:.1f} | "
                       f"{r['latency_p50']:.1f} | "
                       f"{r['latency_p99']:.1f} | {r['tpot_ms'] or 0:.1f} | "
                       f"{r['exact_vs_ar']}/{r['requests']} exact, {r['tokens_outside_band']} outside{mismatch_note(r)} |")
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
                       f"{r['exact_vs_ar']}/{r['requests']} exact{mismatch_note(r)} |")
    opened = combine(rows, "poisson")
    if opened:
        out += ["", "## Poisson arrivals", "",
                "| method | policy | rate (req/s) | max batch | rounds | tok/s | latency mean | p50 | p99 | speedup (latency) | 95% CI | lossless |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in opened:
            out.append(f"| {r['method']} | {r['policy']} | {r['rate']} | {r['batch']} | {r['rounds']} | "
                       f"{r['throughput']:.1f} | {r['latency_mean']:.1f} | {r['latency_p50']:.1f} | "
                       f"{r['latency_p99']:.1f} | {speedup_cell(r)} | {interval_cell(r)} | "
                       f"{r['exact_vs_ar']}/{r['requests']} exact, {r['tokens_outside_band']} outside{mismatch_note(r)} |")
    return "\n".join(out) + "\n"


def plots(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    out.mkdir(parents=True, exist_ok=True)
    for load, x, name, xlabel, ylabel in (
            ("closed", "batch", "speedup_vs_batch", "batch size B (closed batch)", "throughput / batched AR's"),
            ("poisson", "rate", "latency_vs_rate", "request rate (requests / s, Poisson)", "AR's mean latency / the method's")):
        combined = [r for r in combine(rows, load) if r["method"] != "ar"]
        if not combined:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        methods = sorted({r["method"] for r in combined})  # one colour a method, its policies by line style
        for key in sorted({(r["method"], r["policy"]) for r in combined}):
            pts = sorted((r[x], r["speedup"], r["low"], r["high"]) for r in combined if (r["method"], r["policy"]) == key)
            xs, ys, lo, hi = zip(*pts)
            line, = ax.plot(xs, ys, marker="o", linestyle="-" if key[1] == "goodput" else "--",
                            color=f"C{methods.index(key[0])}", label=f"{key[0]} ({key[1]})")
            if any(h > low for low, h in zip(lo, hi)):  # the rounds' range, where there were several
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
        ax.axhline(1.0, color="grey", lw=0.8)
        if load == "closed":
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r[x] for r in combined}))
            ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=120)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", help="Spec-Bench's question.jsonl (needed unless --report-only)")
    ap.add_argument("--per-subtask", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default="ar,tr,tr_fused,pld")
    ap.add_argument("--policies", default="fixed,goodput")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--fixed-batches", help="run fixed speculation only at these batch sizes (default: every one)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds: every configuration this many times, interleaved")
    ap.add_argument("--first-round", type=int, default=1,
                    help="run rounds from this one on (more rounds, or new configurations, for an existing sweep)")
    ap.add_argument("--single-methods", default="ar,tr,tr_fused,pld",
                    help="also run these through the single-request engine (the B = 1 check); empty: none")
    ap.add_argument("--rates", default="", help="Poisson request rates (requests/s), e.g. 0.5,1,2; empty: none")
    ap.add_argument("--rate-batch", type=int, default=16, help="at most this many decoded together under arrivals")
    ap.add_argument("--cost", help="a batch cost JSON (measure_batch_cost); default OUT/batch_cost.json, measured if missing")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--host-memory", choices=HOST_MEMORY, default="keep",
                    help="keep: freed host memory stays for reuse (run/host_memory.py); system: libc's defaults")
    ap.add_argument("--report-only", action="store_true",
                    help="only rewrite OUT/tables.md and OUT/plots from OUT/results.jsonl")
    args = ap.parse_args(argv)
    if not args.report_only and not args.questions:
        ap.error("--questions is required (Spec-Bench's question.jsonl), unless --report-only")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    host_memory = apply_host_memory(args.host_memory)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report(out)
        exit_on_failures(out)
        return
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
    done = {(r["load"], r["method"], r["policy"], r["batch"], r.get("rate"), r.get("round", 1))
            for r in repair_jsonl(results)}
    methods = args.methods.split(",")
    fixed_at = None if args.fixed_batches is None else set(map(int, filter(None, args.fixed_batches.split(","))))
    configs = [("single", m, "fixed", 1, None) for m in filter(None, args.single_methods.split(","))]
    configs += [("closed", m, pol, b, None) for b in map(int, filter(None, args.batches.split(",")))
                for m in methods for pol in (["fixed"] if m == "ar" else args.policies.split(","))
                if m == "ar" or pol != "fixed" or fixed_at is None or b in fixed_at]
    configs += [("poisson", m, pol, args.rate_batch, float(r)) for r in filter(None, args.rates.split(","))
                for m in methods for pol in (["fixed"] if m == "ar" else args.policies.split(","))]
    for round_, load, method, policy, batch, rate in schedule(configs, args.repeats, args.first_round):
        if (load, method, policy, batch, rate, round_) in done:
            continue
        arrivals = poisson_arrivals(len(prompts), rate, args.seed)
        t0 = time.time()
        if load == "single":
            figures = run_single(single, model, prompts, refs, args, method, cost)
        else:
            figures = run_config(engine, model, prompts, refs, args, method, policy, cost, batch, arrivals)
        row = {"load": load, "method": method, "policy": policy, "batch": batch, "rate": rate, "round": round_, **figures,
               "max_new_tokens": args.max_new_tokens, "questions": len(prompts), "seed": args.seed,
               "torch_threads": torch.get_num_threads(), "host_memory": host_memory, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        append_jsonl(results, row)
        print(f"[{round_}] {load} {method} {policy} B={batch} rate={rate}: {figures['throughput']} tok/s, MAT {figures['mat']}, "
              f"{figures['exact_vs_ar']}/{len(prompts)} exact ({time.time() - t0:.0f} s)", flush=True)
    report(out)
    exit_on_failures(out)


def exit_on_failures(out: Path) -> None:
    """Exit 1, naming each failing configuration, when any line of OUT/results.jsonl fails the check."""
    bad = failures(read_jsonl(out / "results.jsonl"))
    if bad:
        for line in bad:
            print(f"LOSSLESS CHECK FAILED: {line}", file=sys.stderr)
        sys.exit(1)


def report(out: Path) -> None:
    """OUT/tables.md and OUT/plots from OUT/results.jsonl (printed)."""
    rows = read_jsonl(out / "results.jsonl")
    (out / "tables.md").write_text(tables(rows))
    plots(rows, out / "plots")
    print((out / "tables.md").read_text())


if __name__ == "__main__":
    main()

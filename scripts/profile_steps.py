"""Where a decoding step's time goes on the embedded model: each step's time by the rows it verified,
with Python's garbage collector on and off and torch's host threads at their default and at one, and
one turn of the method and one of AR under torch's profiler (host operations and device kernels).

    python scripts/profile_steps.py --device cuda --dtype float16 --method pld --out DIR

Written for the GPU node (scripts/gpu_check.py's step_profile stage), where a step of several rows
took either about 20 ms or 65-90 ms while a one-row step took 18-19 ms (results/gpu/README.md); runs
on a CPU too. Writes DIR/step_profile.json (medians per variant) and DIR/step_profile.md (the tables).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from specbench.decoding.engine import Engine
from specbench.inputs.chat import prompt_ids
from specbench.inputs.models import eos_token_ids, load_model, named_model_config, resolve_dtype
from specbench.inputs.tasks import MINI
from specbench.registry import build_drafter

SLOW_MS = 40.0  # a step above this is "slow" in the counts (the node's one-row steps took 18-19 ms)


def step_table(results) -> dict:
    """{'1': [ms...], 'many': [ms...]} from TurnResults: one-row steps apart from the wider ones."""
    one, many = [], []
    for r in results:
        for rows, t in zip(r.step_rows, r.step_times):
            (one if rows == 1 else many).append(1000 * t)
    return {"one_row": one, "several_rows": many}


def describe(times: list[float]) -> dict:
    if not times:
        return {"steps": 0}
    return {"steps": len(times), "median_ms": round(statistics.median(times), 2), "min_ms": round(min(times), 2),
            "max_ms": round(max(times), 2), "slow": sum(t > SLOW_MS for t in times)}


def generate_all(engine, drafter, prompts, max_new) -> list:
    out = []
    for p in prompts:
        drafter.reset()
        out.append(engine.generate(p, drafter, max_new))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--method", default="pld")
    ap.add_argument("--prompts", type=int, default=3, help="built-in prompts per variant")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default="step_profile")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    t0 = time.time()
    model, tok = load_model(named_model_config("smollm2-135m"), device, resolve_dtype(args.dtype))
    engine = Engine(model, eos_token_ids(model, tok))
    vocab = model.get_output_embeddings().weight.shape[0]
    drafter = build_drafter(args.method, vocab_size=vocab, model=model, device=device, model_name="smollm2-135m",
                            dtype_name=args.dtype)
    ar = build_drafter("ar")
    # prompts an answer copies from (summarising, context questions, translation): PLD drafts several rows
    copying = [q for kind in ("summarization", "rag", "translation") for q in MINI if q.subtask == kind]
    prompts = [prompt_ids(tok, [{"role": "user", "content": q.turns[0]}]) for q in copying[: args.prompts]]
    generate_all(engine, drafter, prompts[:1], 16)  # first use: kernels, allocator, lazy initialisation
    generate_all(engine, ar, prompts[:1], 16)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "method": args.method, "dtype": args.dtype,
              "threads": torch.get_num_threads(), "load_seconds": round(time.time() - t0, 1), "variants": {}}

    def variant(name: str, gc_on: bool, threads: int | None):
        default_threads = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        gc.collect()
        if not gc_on:
            gc.disable()
        try:
            t = time.time()
            steps = step_table(generate_all(engine, drafter, prompts, args.max_new_tokens))
            ar_steps = step_table(generate_all(engine, ar, prompts, args.max_new_tokens))
        finally:
            gc.enable()
            torch.set_num_threads(default_threads)
        report["variants"][name] = {"seconds": round(time.time() - t, 1),
                                    **{k: describe(v) for k, v in steps.items()},
                                    "ar_one_row": describe(ar_steps["one_row"])}
        print(f"profile_steps: {name}: {report['variants'][name]}", flush=True)

    variant("default", gc_on=True, threads=None)
    variant("gc off", gc_on=False, threads=None)
    variant("1 host thread", gc_on=True, threads=1)
    variant("default again", gc_on=True, threads=None)  # drift over time, against the first

    tables = []
    for name, d in (("method", drafter), ("ar", ar)):
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activities) as prof:
            res = generate_all(engine, d, prompts[:1], args.max_new_tokens)
        st = step_table(res)
        head = (f"### {args.method if name == 'method' else 'ar'}: one turn under the profiler "
                f"(one-row steps {describe(st['one_row'])}, wider {describe(st['several_rows'])})")
        tables += [head, "", "```", prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), "```", ""]
    md = [f"# Step profile: {report['method']} on SmolLM2-135M, {report['dtype']}, {report['device']}", "",
          "| variant | one-row steps: median ms (slow/all) | wider steps: median ms (slow/all); fastest | AR: median ms (slow/all) |",
          "|---|---|---|---|"]
    for name, v in report["variants"].items():
        o, m, a = v["one_row"], v["several_rows"], v["ar_one_row"]
        md.append(f"| {name} | {o.get('median_ms', '-')} ({o.get('slow', 0)}/{o['steps']}) | "
                  f"{m.get('median_ms', '-')} ({m.get('slow', 0)}/{m['steps']}); {m.get('min_ms', '-')} | "
                  f"{a.get('median_ms', '-')} ({a.get('slow', 0)}/{a['steps']}) |")
    md += ["", f"slow: above {SLOW_MS:g} ms. Host threads by default: {report['threads']}.", ""] + tables
    (out / "step_profile.json").write_text(json.dumps(report, indent=1))
    (out / "step_profile.md").write_text("\n".join(md))
    print(f"profile_steps: wrote {out / 'step_profile.md'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

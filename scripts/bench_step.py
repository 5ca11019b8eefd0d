"""The decoding step, split: where a step's milliseconds go, on a CPU or a GPU (not a test).

Two parts, each printed and written as JSON (`--out`):

1. `ratio`: the engine's AR step on the CUDA-shaped path (`fixed_shapes=True`: row buckets, static
   input buffers, attention over the whole cache buffer) against the compiled model call alone, on a
   random model of SmolLM2's depth and tiny width (`tiny-depth-135m`), one thread, in one process.
   The model call alone is a plain `torch.compile` of the model's forward on the same static cache,
   with its inputs made once; the engine's step is everything else a step does on top of it.
2. `split` (per method, `--methods`): ms per step in the engine's phases (`Engine.step_split`): the
   host before the forward, the forward (on CUDA: its launch or graph replay), waiting for the device
   (the step's one read), verification and compaction, the drafter's `propose` and `observe`.

    python scripts/bench_step.py --shape tiny-depth-135m --methods ar,pld,tr_fused --out step.json
    python scripts/bench_step.py --model smollm2-135m --methods ar,tr_fused,pld,suffix --temperature 0.7

The figures belong in docs/results-log.md with this command, run alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

PROMPT = [1 + (7 * i) % 97 for i in range(48)]


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="tiny-depth-135m", help="a random-weight shape (speculation/shapes.py)")
    ap.add_argument("--model", default=None, help="a named model instead of a shape (its real weights)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="float32 on a CPU, float16 on CUDA by default")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--turns", type=int, default=3, help="timed turns per contender")
    ap.add_argument("--methods", default="", help="comma-separated methods for part 2 (empty: part 1 only)")
    ap.add_argument("--forward", default="fixed", choices=["fixed", "compiled", "eager"],
                    help="part 2's forward: fixed shapes (the CUDA path), the CPU's compiled one, or eager")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--skip-ratio", action="store_true")
    ap.add_argument("--out", default=None)
    return ap, ap.parse_args(argv)


def load(args):
    """(model, prompts, eos, name, dtype name)."""
    dtype_name = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    dtype = getattr(torch, dtype_name)
    if args.model is None:
        from specbench.speculation.shapes import check_shape_name, random_model

        name = check_shape_name(args.shape)
        return random_model(name, args.device, dtype), [PROMPT], [], name, dtype_name
    from specbench.inputs.chat import prompt_ids
    from specbench.inputs.models import eos_token_ids, load_model, named_model_config
    from specbench.inputs.tasks import MINI, select_per_subtask

    cfg = named_model_config(args.model)
    model, tok = load_model(cfg, torch.device(args.device), dtype)
    prompts = [prompt_ids(tok, [{"role": "user", "content": q.turns[0]}], cfg.get("chat_template", "auto"))
               for q in select_per_subtask(list(MINI), 1)]
    return model, prompts, eos_token_ids(model, tok), args.model, dtype_name


def engine_for(model, eos, forward: str):
    from specbench.decoding.engine import Engine

    if forward == "eager":
        return Engine(model, eos)
    return Engine(model, eos, compiled=True, fixed_shapes=forward == "fixed")


@torch.inference_mode()
def model_call_alone(model, engine, calls: int) -> float:
    """Median seconds of one compiled call of the model's forward over one row at a 48-token context,
    on the engine's own static cache, its inputs made once (the floor of an AR step on this forward)."""
    from specbench.decoding.compiled import model_identity_guards
    from specbench.decoding.kv_cache import with_cache
    from specbench.timing import now

    cache = engine.new_cache(len(PROMPT), 8)
    cap, n = cache.layers[0].max_cache_len, len(PROMPT)
    kw = with_cache(model, cache)

    def call(ids, pos, mask):
        return model(input_ids=ids, position_ids=pos, attention_mask=mask, **kw, use_cache=True).logits

    compiled = torch.compile(call, fullgraph=True, dynamic=False, options={"guard_filter_fn": model_identity_guards})
    ids = torch.ones((1, 1), dtype=torch.long, device=model.device)
    pos = torch.full((1, 1), n, dtype=torch.long, device=model.device)
    lo = torch.finfo(model.dtype).min
    mask = torch.full((1, 1, 1, cap), lo, dtype=model.dtype, device=model.device)
    mask[..., : n + 1] = 0
    times = []
    for i in range(calls + 3):  # the first compiles
        for layer in cache.layers:
            layer.cumulative_length.fill_(n)
        t0 = now(model.device)
        compiled(ids, pos, mask)
        if i >= 3:
            times.append(now(model.device) - t0)
    return statistics.median(times)


def ar_step(engine, prompts, max_new: int, turns: int) -> float:
    """Median seconds of the engine's AR step (TurnResult.step_times) over `turns` turns after a warm-up."""
    from specbench.methods.ar import Autoregressive

    engine.generate(prompts[0], Autoregressive(), max_new)
    times = []
    for t in range(turns):
        times += engine.generate(prompts[t % len(prompts)], Autoregressive(), max_new).step_times
    return statistics.median(times)


def ratio(model, prompts, args) -> dict:
    engine = engine_for(model, [], "fixed")
    if engine.compiled is None:
        sys.exit("error: the compiled forward failed here (its warning: line above); part 1 needs it")
    step = ar_step(engine, [PROMPT], args.max_new_tokens, args.turns)
    alone = model_call_alone(model, engine, 200)
    out = {"ar_step_ms": round(1e3 * step, 4), "model_call_alone_ms": round(1e3 * alone, 4),
           "ratio": round(step / alone, 3), "forward": engine.forward_name}
    print(f"ratio: engine AR step {out['ar_step_ms']:.3f} ms / compiled model call alone "
          f"{out['model_call_alone_ms']:.3f} ms = {out['ratio']:.2f}x", flush=True)
    return out


def build(method: str, model, name: str, dtype_name: str, curve, sampler):
    """The method's drafter with its default settings, offered what a run offers it (run/target.py)."""
    from specbench.drafter import Target
    from specbench.registry import drafter_class

    target = Target(vocab_size=model.get_output_embeddings().weight.shape[0], device=model.device, model=model,
                    model_name=name, dtype_name=dtype_name, hardware_curve=curve, sampler=sampler)
    cls = drafter_class(method)
    return cls(target, cls.Settings())


def method_split(engine, drafter, prompts, args, sampler) -> dict:
    """ms per step by phase (step.PHASES) over `args.turns` turns after a warm-up turn."""
    from specbench.decoding.step import PHASES

    engine.generate(prompts[0], drafter, args.max_new_tokens, sampler)  # first-call costs, a hot start
    totals, steps, rows, tokens = dict.fromkeys(PHASES, 0.0), 0, 0, 0
    wall = 0.0
    for t in range(args.turns):
        if sampler is not None:
            sampler.bind(t, 0)
        r = engine.generate(prompts[t % len(prompts)], drafter, args.max_new_tokens, sampler)
        for k, v in r.phase_seconds.items():
            totals[k] += v
        steps, rows, tokens = steps + r.decoding_steps, rows + sum(r.step_rows), tokens + sum(r.accept_lengths)
        wall += sum(r.step_times)
    out = {"steps": steps, "rows_per_step": round(rows / steps, 2), "mat": round(tokens / steps, 3),
           "ms_per_step": round(1e3 * wall / steps, 4)}
    out |= {f"{k}_ms": round(1e3 * v / steps, 4) for k, v in totals.items()}
    out["drafter_ms"] = round(out["propose_ms"] + out["observe_ms"], 4)
    return out


def split(model, prompts, eos, name: str, dtype_name: str, args) -> dict:
    """Part 2: every method of `--methods` on `--forward`, the step split into its phases."""
    from specbench.decoding.sampling import PositionSampler
    from specbench.speculation.cost import measure_cost_curve

    engine = engine_for(model, eos, args.forward)
    # the curve the goodput drafters choose their trees by: this forward's, measured quickly here
    curve = measure_cost_curve(model, context_len=len(prompts[0]), repeats=3, warmup=1, model_name=name,
                               dtype_name=dtype_name, engine=engine)
    out = {"forward": engine.forward_name, "temperature": args.temperature}
    for method in filter(None, args.methods.split(",")):
        sampler = PositionSampler(args.temperature, seed=0) if args.temperature > 0 else None
        if sampler is not None:
            sampler.prepare(model.device)  # its kernel and table, before anything is timed
        try:
            drafter = build(method, model, name, dtype_name, curve, sampler)
        except Exception as e:  # noqa: BLE001 (a method that needs what this model lacks: a head, a datastore)
            print(f"warning: {method} skipped ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
            continue
        out[method] = m = method_split(engine, drafter, prompts, args, sampler)
        print(f"{method}: {m['ms_per_step']:.3f} ms/step ({m['rows_per_step']} rows, MAT {m['mat']}): "
              + ", ".join(f"{k[:-3]} {m[k]:.3f}" for k in m if k.endswith("_ms") and k != "ms_per_step"),
              flush=True)
    return out


def main(argv=None) -> None:
    ap, args = parse(argv)
    torch.set_num_threads(args.threads)
    model, prompts, eos, name, dtype_name = load(args)
    res = {"model": name, "device": args.device, "dtype": dtype_name, "threads": args.threads,
           "torch": torch.__version__, "max_new_tokens": args.max_new_tokens,
           "date": time.strftime("%Y-%m-%d")}
    if not args.skip_ratio:
        res["ratio"] = ratio(model, prompts, args)
    if args.methods.strip(","):
        res["split"] = split(model, prompts, eos, name, dtype_name, args)
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Engine overhead benchmark (not a test).

1. Transformers' `generate` (greedy, eager), our AR loop on the eager forward and our AR loop on
   the compiled forward (specbench/decoding/compiled.py) on the same prompts, interleaved in one
   run (the order rotates per prompt), so the ratios are measured side by side on the same machine.
   Compiling happens before the first timed call and is reported apart.
2. For Token Recycling: the share of each decoding step spent outside the model forward
   (drafting, masks, verification, KV compaction, matrix update).
3. For Token Recycling at temperature 0.7: the share of the step spent drawing the target's
   samples (filtering, position-keyed Gumbel noise for every tree depth, argmax).
4. With `--step-overheads tr_fused,pld,...`: the same split as 2 for those methods on the compiled
   forward, where a step is 25-40 ms on this CPU and the work outside the forward weighs more:
   ms per step inside and outside the forward, and the share outside. Methods that read the cost
   curve get the compiled forward's (the runner's cache, else a quick one measured here).

    python scripts/bench_engine.py --questions path/to/question.jsonl --per-subtask 1 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from specbench.methods.ar import Autoregressive
from specbench.methods.tr.base import TokenRecycling
from specbench.inputs.chat import prompt_ids
from specbench.decoding.forward_choice import PRODUCTS
from specbench.decoding.engine import Engine
from specbench.inputs.models import add_model_arguments, eos_token_ids, load_model_from_arguments
from specbench.decoding.sampling import PositionSampler
from specbench.inputs.tasks import MINI, load_jsonl_questions, select_per_subtask
from specbench.timing import now
from specbench.speculation.cost import resolve_curve
from specbench.errors import SettingsError
from specbench.registry import build_drafter, drafter_class


class TimedSampler:
    """A PositionSampler that adds up the (device-synchronised) time spent in it."""

    def __init__(self, sampler: PositionSampler, device):
        self.sampler, self.device, self.seconds, self.calls = sampler, device, 0.0, 0

    def bind(self, question_id, turn: int) -> None:
        self.sampler.bind(question_id, turn)

    def __call__(self, logits, positions):
        t0 = now(self.device)
        out = self.sampler(logits, positions)
        self.seconds += now(self.device) - t0
        self.calls += 1
        return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    ap.add_argument("--questions", default=None, help="question.jsonl (default: the built-in mini set)")
    ap.add_argument("--per-subtask", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--ar-only", action="store_true", help="part 1 only (generate, eager AR, compiled AR)")
    ap.add_argument("--products", default="auto", choices=PRODUCTS,
                    help="the compiled forward's matrix products (compile_products; auto = packed where it runs)")
    ap.add_argument("--also-inductor", action="store_true",
                    help="part 1 also times AR on the compiled forward with inductor's own products")
    ap.add_argument("--step-overheads", default="",
                    help="comma-separated methods: part 4, the step outside the forward on the compiled forward")
    args = ap.parse_args(argv)
    for name in filter(None, args.step_overheads.split(",")):  # refused now, not after part 1's minutes
        try:
            drafter_class(name)
        except SettingsError as e:
            ap.error(str(e))

    mcfg, model, tok, device, _ = load_model_from_arguments(ap, args)
    eos = eos_token_ids(model, tok)
    qs = load_jsonl_questions(args.questions) if args.questions else list(MINI)
    qs = select_per_subtask(qs, args.per_subtask)
    prompts = [prompt_ids(tok, [{"role": "user", "content": q.turns[0]}], mcfg.get("chat_template", "auto"))
               for q in qs]

    engine = Engine(model, eos)
    compiled = Engine(model, eos, compiled=True, products=args.products)
    inductor = Engine(model, eos, compiled=True, products="inductor") if args.also_inductor else None
    ar = Autoregressive()

    def ours(ids):
        r = engine.generate(ids, ar, args.max_new_tokens)
        return r.tokens, r.wall_time

    def ours_compiled(ids):
        r = compiled.generate(ids, ar, args.max_new_tokens)
        return r.tokens, r.wall_time

    def hf(ids):
        t0 = now(device)
        out = model.generate(torch.tensor([ids], device=device), max_new_tokens=args.max_new_tokens,
                             do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
        t = now(device) - t0
        return out[0, len(ids):].tolist(), t

    def ours_inductor(ids):
        r = inductor.generate(ids, ar, args.max_new_tokens)
        return r.tokens, r.wall_time

    contenders = [("ours", ours), ("generate", hf), ("ours_compiled", ours_compiled)]
    if inductor is not None:
        contenders.append(("ours_compiled_inductor", ours_inductor))
    for _, fn in contenders:  # warm-up (compiles)
        fn(prompts[0])
    speeds = {name: [] for name, _ in contenders}
    same, same_compiled, same_inductor = True, True, True
    for rep in range(args.repeats):
        for i, ids in enumerate(prompts):
            k = (rep + i) % len(contenders)
            toks = {}
            for name, fn in contenders[k:] + contenders[:k]:
                t, secs = fn(ids)
                toks[name] = t
                speeds[name].append(len(t) / secs)
            same &= toks["ours"] == toks["generate"]
            same_compiled &= toks["ours_compiled"] == toks["ours"]
            if inductor is not None:
                same_inductor &= toks["ours_compiled_inductor"] == toks["ours"]
        print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(
            f"{n} {statistics.mean(v):.1f} tok/s" for n, v in speeds.items()), flush=True)
    mean = {n: statistics.mean(v) for n, v in speeds.items()}
    ar_ratio = mean["ours"] / mean["generate"]

    res = {
        "device": str(device), "dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "ar_tokens_per_s": mean["ours"], "generate_tokens_per_s": mean["generate"],
        "ar_over_generate": ar_ratio, "ar_outputs_identical": same,
        "ar_compiled_tokens_per_s": mean["ours_compiled"],
        "ar_compiled_over_generate": mean["ours_compiled"] / mean["generate"],
        "ar_compiled_over_eager": mean["ours_compiled"] / mean["ours"],
        "ar_compiled_outputs_identical_to_eager": same_compiled,
        "compiled_forward": compiled.compiled.name,
        "compile_seconds": round(compiled.compiled.compile_seconds, 1),
        # graphs traced since the last engine prepared (the counter is the process's)
        "recompiles_while_timed": min(e.compiled.recompiles() for e in (compiled, inductor) if e is not None),
    }
    if inductor is not None:
        res.update({
            "ar_compiled_inductor_tokens_per_s": mean["ours_compiled_inductor"],
            "ar_compiled_over_compiled_inductor": mean["ours_compiled"] / mean["ours_compiled_inductor"],
            "ar_compiled_inductor_outputs_identical_to_eager": same_inductor,
            "compile_seconds_inductor": round(inductor.compiled.compile_seconds, 1),
        })
    if not args.ar_only:
        res.update(tr_overheads(model, eos, prompts, args, device))
    if args.step_overheads.strip(","):
        res["compiled_step_overheads"] = step_overheads(compiled, model, mcfg["name"], args.dtype, prompts,
                                                        [m for m in args.step_overheads.split(",") if m], args.max_new_tokens)
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


def tr_overheads(model, eos, prompts, args, device) -> dict:
    """Parts 2 and 3, on the eager forward."""
    prof = Engine(model, eos, profile=True)
    tr = TokenRecycling(vocab_size=model.get_output_embeddings().weight.shape[0], device=device)
    prof.generate(prompts[0], tr, args.max_new_tokens)  # warm the matrix, as a hot start would
    decode, fwd, steps = 0.0, 0.0, 0
    for ids in prompts:
        r = prof.generate(ids, tr, args.max_new_tokens)
        decode += r.wall_time - r.prefill_time
        fwd += r.forward_time
        steps += r.decoding_steps
    overhead = (decode - fwd) / decode

    sampler = TimedSampler(PositionSampler(0.7, seed=0), device)
    s_decode, s_steps = 0.0, 0
    for i, ids in enumerate(prompts):
        sampler.bind(i, 0)
        r = prof.generate(ids, tr, args.max_new_tokens, sampler)
        s_decode += r.wall_time - r.prefill_time
        s_steps += r.decoding_steps

    return {
        "tr_steps": steps, "tr_ms_per_step": 1000 * decode / steps,
        "tr_ms_outside_forward_per_step": 1000 * (decode - fwd) / steps,
        "tr_share_outside_forward": overhead,
        "tr_t0.7_steps": s_steps, "tr_t0.7_ms_per_step": 1000 * s_decode / s_steps,
        "tr_t0.7_ms_sampling_per_step": 1000 * sampler.seconds / sampler.calls,
        "tr_t0.7_share_sampling": sampler.seconds / s_decode,
    }


def step_overheads(engine, model, model_name, dtype_name, prompts, methods, max_new) -> dict:
    """Part 4: per method, ms per decoding step inside and outside the forward on `engine`'s (compiled)
    forward, over every prompt after one warm-up generation."""
    curve = resolve_curve(None, model, model_name, dtype_name, engine=engine)
    engine.profile = True
    out = {}
    for name in methods:
        drafter = build_drafter(name, vocab_size=model.get_output_embeddings().weight.shape[0],
                                device=engine.device, model=model, model_name=model_name, dtype_name=dtype_name,
                                hardware_curve=curve)
        engine.generate(prompts[0], drafter, max_new)  # warm-up: first-call costs, a hot start
        decode, fwd, steps, rows = 0.0, 0.0, 0, 0
        for ids in prompts:
            r = engine.generate(ids, drafter, max_new)
            decode += r.wall_time - r.prefill_time
            fwd += r.forward_time
            steps += r.decoding_steps
            rows += sum(r.step_rows)
        out[name] = {"steps": steps, "rows_per_step": rows / steps, "ms_per_step": 1000 * decode / steps,
                     "ms_forward_per_step": 1000 * fwd / steps, "ms_outside_forward_per_step": 1000 * (decode - fwd) / steps,
                     "share_outside_forward": (decode - fwd) / decode}
        print(f"{name}: {out[name]['ms_per_step']:.1f} ms per step ({out[name]['rows_per_step']:.1f} rows), "
              f"{out[name]['ms_outside_forward_per_step']:.2f} ms outside the forward "
              f"({100 * out[name]['share_outside_forward']:.1f}%)", flush=True)
    engine.profile = False
    return out


if __name__ == "__main__":
    main()

"""Methods against each other, interleaved prompt by prompt in one process (not a test).

    python scripts/head_to_head.py --questions data/code_edit/code_edit.jsonl --per-subtask 2 \
        --methods ar suffix tr_fused:retrieval=suffix --cost-curve results/cpu-tasks/cost_curve.json \
        [--temperature 0.7] [--max-new-tokens 512] [--out FILE.json]

A sweep's runs each time a method against AR, and runs made an hour apart meet a machine that has
drifted by as much as the gaps between the leaders (docs/results-log.md, 2026-11-28). Here every method
decodes every prompt in turn, the order reversed on every other prompt, on one compiled forward, each
drafter hot across prompts after one untimed warm-up prompt of its own (which also compiles the shapes
it asks for). Reported per method: decoding ms per token (the steps' time over the tokens they emitted;
prefill apart), the same without the drafter's own `propose` and `observe`, MAT, rows per step, and
each against the first method. A method's settings follow a colon: `tr_fused:retrieval=suffix,calibrate=true`.
Every method's tokens are checked against the first method's (greedy: equal; sampled: the same
position-keyed draw, so equal too).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml

from specbench.decoding.engine import Engine
from specbench.decoding.sampling import PositionSampler
from specbench.drafter import Target
from specbench.inputs.chat import answer_text, prompt_ids
from specbench.inputs.models import eos_token_ids, load_model, named_model_config
from specbench.inputs.tasks import load_jsonl_questions, select_per_subtask
from specbench.markdown import markdown_table
from specbench.registry import drafter_class
from specbench.speculation.cost import CostCurve


def parse_method(spec: str) -> tuple[str, dict]:
    """`name` or `name:key=value,key=value` -> (name, settings)."""
    name, _, rest = spec.partition(":")
    settings = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in rest.split(",") if kv)}
    return name, settings


def build(spec: str, target):
    name, settings = parse_method(spec)
    cls = drafter_class(name)
    return cls(target, cls.Settings(**cls.check_settings({**cls.parameters(), **settings}, {})))


def decode(engine, tok, drafter, question, sampler, max_new: int) -> list:
    """Every turn of `question` (earlier answers in the history), as a run decodes it: the turns' results."""
    drafter.start_question()
    messages, results = [], []
    for turn, text in enumerate(question.turns):
        messages.append({"role": "user", "content": text})
        if sampler is not None:
            sampler.bind(question.question_id, turn)
        r = engine.generate(prompt_ids(tok, messages), drafter, max_new, sampler)
        messages.append({"role": "assistant", "content": answer_text(tok, r.tokens)})
        results.append(r)
    return results


def summary(results: list) -> dict:
    steps = sum(len(r.step_times) for r in results)
    tokens = sum(len(r.tokens) for r in results)
    step_s = sum(sum(r.step_times) for r in results)
    drafter_s = sum(sum(r.step_propose_times) + sum(r.step_observe_times) for r in results)
    rows = sum(sum(r.step_rows) for r in results)
    return {"tokens": tokens, "steps": steps, "mat": tokens / steps, "rows_per_step": rows / steps,
            "ms_per_token": 1e3 * step_s / tokens, "ms_per_token_without_drafter": 1e3 * (step_s - drafter_s) / tokens,
            "drafter_ms_per_step": 1e3 * drafter_s / steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True, help="a task's question.jsonl")
    ap.add_argument("--per-subtask", type=int, default=2)
    ap.add_argument("--methods", required=True, nargs="+", help="methods, each name[:key=value,...]")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--cost-curve", required=True, help="the curve goodput drafters choose from (a run's cost_curve.json)")
    ap.add_argument("--eager", action="store_true", help="the eager forward (default: compiled)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), torch.float32)
    engine = Engine(model, eos_token_ids(model, tok), compiled=not args.eager)
    curve = CostCurve.load(args.cost_curve)
    sampler = PositionSampler(args.temperature, seed=0) if args.temperature > 0 else None
    target = Target(vocab_size=model.get_output_embeddings().weight.shape[0], device=model.device, model=model,
                    model_name="smollm2-135m", dtype_name="float32", hardware_curve=curve, sampler=sampler)
    drafters = {spec: build(spec, target) for spec in args.methods}
    questions = select_per_subtask(load_jsonl_questions(args.questions), args.per_subtask)
    warm, timed = questions[0], questions[1:]
    for d in drafters.values():
        decode(engine, tok, d, warm, sampler, args.max_new_tokens)
    results = {spec: [] for spec in drafters}
    first = args.methods[0]
    for i, q in enumerate(timed):
        order = args.methods if i % 2 == 0 else args.methods[::-1]
        answers = {spec: decode(engine, tok, drafters[spec], q, sampler, args.max_new_tokens) for spec in order}
        for spec in args.methods:
            for mine, theirs in zip(answers[spec], answers[first]):
                if mine.tokens != theirs.tokens:
                    print(f"error: {spec} differs from {first} on {q.question_id}", file=sys.stderr)
                    return 1
            results[spec] += answers[spec]
        print(f"{i + 1}/{len(timed)} {q.question_id}", flush=True)
    rows, out = [], {}
    for spec in args.methods:
        s = out[spec] = summary(results[spec])
        base = out[first]
        rows.append([spec, f"{s['mat']:.2f}", f"{s['rows_per_step']:.1f}", f"{s['ms_per_token']:.2f}",
                     f"{s['ms_per_token_without_drafter']:.2f}", f"{s['drafter_ms_per_step']:.2f}",
                     f"{base['ms_per_token'] / s['ms_per_token']:.3f}x"])
    print(markdown_table(["method", "MAT", "rows/step", "ms/token", "ms/token less drafter", "drafter ms/step",
                          f"against {first}"], rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"questions": args.questions, "temperature": args.temperature,
                                              "max_new_tokens": args.max_new_tokens, "timed": len(timed),
                                              "methods": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

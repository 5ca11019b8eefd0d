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
Every method's tokens are checked as a run checks them (run/lossless.py): each emitted token against
the target's choice in a teacher-forced forward, within the rounding band measured for this forward.
Methods may then part where two logits are within the band of each other; such prompts are counted
(`prompts_differing`), and a token outside the band stops the comparison.
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
from specbench.errors import SpecbenchError
from specbench.inputs.models import eos_token_ids, load_model, named_model_config
from specbench.inputs.tasks import load_jsonl_questions, select_per_subtask
from specbench.markdown import markdown_table
from specbench.registry import drafter_class
from specbench.run import lossless
from specbench.run.question_loop import run_question
from specbench.run.rounding_band import load_or_measure
from specbench.speculation.cost import CostCurve


def parse_method(spec: str) -> tuple[str, dict]:
    """`name` or `name:key=value,key=value` -> (name, settings)."""
    name, _, rest = spec.partition(":")
    settings = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in rest.split(",") if kv)}
    return name, settings


def checked(spec: str) -> tuple:
    """(the method's class, its checked settings): refused in one line before any model loads."""
    name, settings = parse_method(spec)
    cls = drafter_class(name)
    return cls, cls.check_settings({**cls.parameters(), **settings}, {})


def summary(turns: list[dict]) -> dict:
    """Per method, over its timed turns (run_question's records)."""
    steps = sum(len(t["step_times"]) for t in turns)
    tokens = sum(len(t["token_ids"]) for t in turns)
    step_s = sum(sum(t["step_times"]) for t in turns)
    drafter_s = sum(sum(t["step_propose_times"]) + sum(t["step_observe_times"]) for t in turns)
    rows = sum(sum(t["step_rows"]) for t in turns)
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
    try:
        classes = {spec: checked(spec) for spec in args.methods}
        curve = CostCurve.load(args.cost_curve)
        questions = select_per_subtask(load_jsonl_questions(args.questions), args.per_subtask)
    except (SpecbenchError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)

    mcfg = named_model_config("smollm2-135m")
    template = mcfg.get("chat_template", "auto")
    model, tok = load_model(mcfg, torch.device("cpu"), torch.float32)
    engine = Engine(model, eos_token_ids(model, tok), compiled=not args.eager)
    sampler = PositionSampler(args.temperature, seed=0) if args.temperature > 0 else None
    if sampler is not None:
        sampler.prepare(model.device)  # its kernel and table, before anything is timed
    target = Target(vocab_size=model.get_output_embeddings().weight.shape[0], device=model.device, model=model,
                    model_name="smollm2-135m", dtype_name="float32", hardware_curve=curve, sampler=sampler)
    drafters = {spec: cls(target, cls.Settings(**settings)) for spec, (cls, settings) in classes.items()}
    band = load_or_measure(model, tok, "smollm2-135m", "cpu", "float32", engine=engine, template=template)

    def decode(spec, q):  # every turn as a run decodes it: the system prompt, turn 2 after the model's turn 1
        return run_question(engine, drafters[spec], tok, q, template, args.max_new_tokens, sampler)["turns"]

    warm, timed = questions[0], questions[1:]
    for spec in drafters:
        decode(spec, warm)
    results = {spec: [] for spec in drafters}
    checks = {spec: [] for spec in drafters}
    first = args.methods[0]
    differing = 0
    for i, q in enumerate(timed):
        order = args.methods if i % 2 == 0 else args.methods[::-1]
        answers = {spec: decode(spec, q) for spec in order}
        for spec in args.methods:
            c = lossless.check_tokens(model, {"turns": answers[spec]}, "float32", sampler, q.question_id, band)
            checks[spec].append(c)
            if c["tokens_outside_band"]:
                print(f"error: {spec} emitted a token outside the rounding band on {q.question_id}: "
                      f"{c['first_outside']}", file=sys.stderr)
                return 1
            results[spec] += answers[spec]
        same = all([t["token_ids"] for t in answers[spec]] == [t["token_ids"] for t in answers[first]]
                   for spec in args.methods)
        differing += not same
        print(f"{i + 1}/{len(timed)} {q.question_id}{'' if same else ' (methods part within the band)'}", flush=True)
    rows, out = [], {}
    for spec in args.methods:
        s = out[spec] = summary(results[spec])
        s.update({k: sum(c[k] for c in checks[spec]) for k in ("tokens_checked", "tokens_equal", "tokens_numeric",
                                                               "tokens_outside_band")})
        base = out[first]
        rows.append([spec, f"{s['mat']:.2f}", f"{s['rows_per_step']:.1f}", f"{s['ms_per_token']:.2f}",
                     f"{s['ms_per_token_without_drafter']:.2f}", f"{s['drafter_ms_per_step']:.2f}",
                     f"{base['ms_per_token'] / s['ms_per_token']:.3f}x", str(s["tokens_numeric"])])
    print(f"every token within the band ({band.get('band_ulps')} ulps); prompts where methods part: {differing}")
    print(markdown_table(["method", "MAT", "rows/step", "ms/token", "ms/token less drafter", "drafter ms/step",
                          f"against {first}", "tokens numeric"], rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"questions": args.questions, "temperature": args.temperature,
                                              "max_new_tokens": args.max_new_tokens, "timed": len(timed),
                                              "prompts_differing": differing, "band_ulps": band.get("band_ulps"),
                                              "methods": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

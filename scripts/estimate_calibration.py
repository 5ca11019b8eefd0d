"""How well a drafter's node estimates predict what is accepted: every drafted node's estimate
(`Draft.node_probs`: the probability the drafter gave it of lying on the accepted path) against
whether it was accepted, over Spec-Bench questions on the embedded model (not a test).

    python scripts/estimate_calibration.py --method tr_fused --temperature 0.7 \
        --questions ../shared/data/spec_bench/question.jsonl --cost-curve results/cpu-headline-v2/cost_curve.json \
        [--set agreement=false --set depth_cells=false --set pooled_prior=false] [--out FILE.json]

An estimator that promises more than is accepted makes a goodput chooser verify rows that do not
pay. Prints what the steps' forwards cost on the curve (AR's time for the tokens over the steps', each at
its context: the speedup were the drafter's host work free), the totals (estimated and accepted nodes), a
reliability table by estimate bin, and the same per source for tr_fused (matrix, retrieval, both); any
method's steps can be put on the curve, its estimates where it gives them. Eager forward, both turns of each question,
the drafter learning across questions as in a run (no warm-up); timing plays no part.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
import yaml

from specbench.decoding.engine import Engine
from specbench.decoding.sampling import PositionSampler
from specbench.drafter import Target
from specbench.inputs.models import eos_token_ids, load_model, named_model_config
from specbench.inputs.tasks import load_jsonl_questions, select_per_subtask
from specbench.markdown import markdown_table
from specbench.registry import drafter_class
from specbench.run.question_loop import run_question
from specbench.speculation.cost import CostCurve, run_bound

SOURCES = {1: "matrix", 2: "retrieval", 3: "both"}


def recording(drafter, steps: list[dict]):
    """The drafter with its propose / observe wrapped to append, per drafted step, each node's
    estimate, source and whether it was accepted."""
    propose, observe = drafter.propose, drafter.observe
    drafted = {}

    def wrapped_propose(state):
        draft = propose(state)
        drafted["probs"] = list(draft.node_probs or []) if draft is not None else None
        drafted["sources"] = list(getattr(getattr(drafter, "chooser", None), "sources", None) or [])
        return draft

    def wrapped_observe(outcome):
        if drafted.get("probs"):
            accepted = set(outcome.accepted)
            steps.append({"probs": drafted["probs"], "sources": drafted["sources"],
                          "hits": [i + 1 in accepted for i in range(len(drafted["probs"]))]})
        return observe(outcome)

    drafter.propose, drafter.observe = wrapped_propose, wrapped_observe
    return drafter


def reliability(steps: list[dict], key=None) -> list[list]:
    """Rows of (group, nodes, mean estimate, accepted rate) by estimate tenth, or by `key(step, i)`."""
    groups = defaultdict(lambda: [0, 0.0, 0])
    for s in steps:
        for i, (p, hit) in enumerate(zip(s["probs"], s["hits"])):
            tenth = min(int(p * 10), 9)
            g = key(s, i) if key else f"{tenth / 10:.1f}-{(tenth + 1) / 10:.1f}"
            groups[g][0] += 1
            groups[g][1] += p
            groups[g][2] += hit
    return [[g, n, f"{s / n:.3f}", f"{h / n:.3f}"] for g, (n, s, h) in sorted(groups.items())]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="tr_fused")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--questions", required=True,
                    help="a task's questions (Spec-Bench's question.jsonl, data/code_edit/code_edit.jsonl, ..)")
    ap.add_argument("--per-subtask", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--cost-curve", required=True, help="the curve the drafter chooses its trees from")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a method setting")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)

    cls = drafter_class(args.method)
    settings = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    settings = cls.check_settings({**cls.parameters(), **settings}, {})
    mcfg = named_model_config("smollm2-135m")
    model, tok = load_model(mcfg, torch.device("cpu"), torch.float32)
    template = mcfg.get("chat_template", "auto")
    curve = CostCurve.load(args.cost_curve)
    sampler = PositionSampler(args.temperature, 0, 1.0, 0) if args.temperature > 0 else None
    target = Target(vocab_size=model.get_output_embeddings().weight.shape[0], device=model.device, model=model,
                    model_name="smollm2-135m", dtype_name="float32", hardware_curve=curve, sampler=sampler)
    steps: list[dict] = []
    drafter = recording(cls(target, cls.Settings(**settings)), steps)
    engine = Engine(model, eos_token_ids(model, tok))
    questions = select_per_subtask(load_jsonl_questions(args.questions), args.per_subtask)
    turns: list[dict] = []  # every turn's steps, for the bound on the curve
    for q in questions:  # as a run decodes it: the system prompt, turn 2 after the model's own turn 1
        turns += run_question(engine, drafter, tok, q, template, args.max_new_tokens, sampler)["turns"]

    estimated = sum(sum(s["probs"]) for s in steps)
    accepted = sum(sum(s["hits"]) for s in steps)
    print(f"{args.method} at T = {args.temperature} {' '.join(args.set)}: {len(steps)} drafted steps, "
          f"{sum(len(s['probs']) for s in steps)} nodes; estimated {estimated:.1f} accepted, accepted {accepted} "
          f"({accepted / estimated:.2f} of the estimate)" if estimated else "no drafted node had an estimate")
    # what the chooser's trees would give were the drafter's host work free: AR's forwards for the
    # tokens over the steps' own, each at its context on the curve (no timing, so no drift)
    bound = run_bound(curve, [{"turns": turns}])
    steps_all = sum(len(t["step_rows"]) for t in turns)
    mat = sum(sum(t["accept_lengths"]) for t in turns) / steps_all
    print(f"{steps_all} steps, MAT {mat:.2f}, {bound['mean_rows']:.1f} rows a step: {bound['bound']:.2f}x on the "
          f"cost curve (forwards only, each at its step's context)")
    head = ["estimate", "nodes", "mean estimate", "accepted"]
    print(markdown_table(head, reliability(steps), pad=True))
    by_source = None
    if any(s["sources"] for s in steps):
        by_source = reliability(steps, key=lambda s, i: SOURCES.get(s["sources"][i], "?"))
        print(markdown_table(["source", *head[1:]], by_source, pad=True))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "method": args.method, "temperature": args.temperature, "settings": args.set,
            "drafted_steps": len(steps), "estimated": estimated, "accepted": accepted,
            "by_estimate": reliability(steps), "by_source": by_source,
            "mat": mat, "bound_on_curve": bound}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

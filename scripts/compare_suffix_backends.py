"""Suffix Decoding's drafts from specbench's own trees against arctic-inference's, step by step on real
answers (not a test: the tests compare the two on random texts and skip where arctic-inference does
not import).

    python scripts/compare_suffix_backends.py --questions ../shared/data/spec_bench/question.jsonl \
        --answers results/cpu-headline-v2/smollm2-135m/spec_bench-ps2/suffix-t0-m128-r1/baseline_answers.jsonl \
        [--answers ...] [--out FILE.json]

Each answers file's turns (AR's outputs, in file order, questions one after the other as a run
answers them; each output re-encoded from its text, which the files keep instead of token ids) are replayed through both backends' trees with the calls the drafter makes: a turn
starts with its prompt and first token, every further token is drafted for and then appended, and an
answered turn stays in the global tree for the next questions. Each step's two drafts are compared
(tokens and parents), and where they differ, their scores (summed estimates): equal scores are a tie
between equally frequent continuations, which the two break differently (docs/suffix-decoding.md).
Settings: vLLM's path drafts (the method's defaults) and the tree that `tr_fused retrieval=suffix`
asks for. Needs arctic-inference (`pip install -e ".[suffix]"`).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from specbench.inputs.chat import prompt_ids
from specbench.inputs.models import load_model, named_model_config
from specbench.inputs.tasks import load_jsonl_questions
from specbench.markdown import markdown_table
from specbench.drafting.suffix_backends import ArcticTrees, arctic_problem
from specbench.drafting.suffix_tree import SuffixTrees
from specbench.run.results_io import read_jsonl

# (name, max_depth, max_cached, max_tokens, factor, offset, min_prob, use_tree): SuffixTrees' arguments
SETTINGS = [
    ("suffix (vLLM's path)", 24, 10000, 24, 1.0, 0.0, 0.1, False),
    ("tr_fused retrieval=suffix (tree)", 24, 0, 16, 4.0, 0.0, 0.1, True),
]


def turns_of(answers: list[dict], questions: dict, tokenizer, template: str):
    """(prompt ids, answer ids) per turn, in the order the run answered them; a question's second
    prompt holds its first answer as text, as the runner builds it."""
    for record in answers:
        q = questions[str(record["question_id"])]
        messages: list[dict] = []
        for text, turn in zip(q.turns, record["turns"]):
            messages.append({"role": "user", "content": text})
            answer = tokenizer.encode(turn["output"], add_special_tokens=False)
            yield prompt_ids(tokenizer, messages, template), answer
            messages.append({"role": "assistant", "content": turn["output"]})


def compare(turns: list[tuple[list[int], list[int]]], setting) -> dict:
    """Both backends through the same turns: steps, identical drafts, drafts that differ with equal
    scores (ties) and with different scores, and steps where the two drew from different trees."""
    _, *args = setting
    ours, theirs = SuffixTrees(*args), ArcticTrees(*args)
    counts = dict(steps=0, drafted=0, identical=0, tie=0, differ=0, other_tree=0)
    worst = 0.0
    for prompt, answer in turns:
        if not answer:
            continue
        for trees in (ours, theirs):
            trees.start_turn(prompt)
            trees.extend(answer[:1])
        context = list(prompt) + answer[:1]
        for tok in answer[1:]:
            tail = np.asarray(context[-args[0]:], dtype=np.int64)
            (a, source_a), (b, source_b) = ours.speculate(tail), theirs.speculate(tail)
            counts["steps"] += 1
            counts["drafted"] += bool(a.tokens or b.tokens)
            if (a.tokens, a.parents) == (b.tokens, b.parents):
                counts["identical"] += 1
            elif abs(a.score - b.score) <= 1e-5 * max(1.0, b.score):
                counts["tie"] += 1
            else:
                counts["differ"] += 1
                worst = max(worst, abs(a.score - b.score))
            counts["other_tree"] += source_a != source_b and bool(a.tokens or b.tokens)
            for trees in (ours, theirs):
                trees.extend([tok])
            context.append(tok)
        for trees in (ours, theirs):
            trees.end_turn(answer)
    return dict(counts, largest_score_gap=worst)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True, help="Spec-Bench's question.jsonl")
    ap.add_argument("--answers", action="append", required=True, help="a run's answers.jsonl or baseline_answers.jsonl")
    ap.add_argument("--out", default=None, help="write the counts as JSON here")
    args = ap.parse_args(argv)
    problem = arctic_problem()
    if problem is not None:
        print(f"error: arctic-inference does not import here ({problem}); install it with "
              f'pip install -e ".[suffix]"', file=sys.stderr)
        return 2

    questions = {str(q.question_id): q for q in load_jsonl_questions(args.questions)}
    mcfg = named_model_config("smollm2-135m")
    _, tokenizer = load_model(mcfg, torch.device("cpu"), torch.float32)
    rows, out = [], {"arctic_inference": metadata.version("arctic-inference"), "runs": []}
    for path in args.answers:
        turns = list(turns_of(read_jsonl(Path(path)), questions, tokenizer, mcfg.get("chat_template", "auto")))
        for setting in SETTINGS:
            c = compare(turns, setting)
            out["runs"].append({"answers": path, "setting": setting[0], **c})
            rows.append([Path(path).parent.name, setting[0], len(turns), c["steps"], c["drafted"], c["identical"],
                         c["tie"], c["differ"], c["other_tree"]])
    print(f"arctic-inference {out['arctic_inference']} against specbench's trees, step by step")
    print(markdown_table(["answers of", "setting", "turns", "steps", "steps drafted", "identical", "tie",
                          "differ", "other tree"], rows, pad=True))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

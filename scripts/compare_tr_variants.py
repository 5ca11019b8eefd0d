"""TR's variants decoded on the real model, every step's accepted length and rows recorded, to hold two checkouts'
code against each other (a refactor that must not change what a drafter does):

    PYTHONPATH=<checkout A> python scripts/compare_tr_variants.py --curve C --out a.json
    PYTHONPATH=<checkout B> python scripts/compare_tr_variants.py --curve C --out b.json
    python scripts/compare_tr_variants.py --compare a.json b.json

Six prompts (five of Spec-Bench's questions, one copy of textwrap.dedent's source), 48 new tokens, T = 0 (one drafter across the
prompts: hot start) and T = 0.7 (a drafter per prompt, coupled to its sampler); tr, tr_adaptive (confidences, slot
statistics), tr_fused (pld, suffix, suffix kept across requests with calibration), all on the cost curve C.
"""
import argparse
import inspect
import json
import sys
import textwrap
from pathlib import Path
import torch
from specbench.inputs.models import load_model, named_model_config, eos_token_ids
from specbench.inputs.chat import prompt_ids
from specbench.decoding.engine import Engine
from specbench.decoding.sampling import PositionSampler
from specbench.registry import build_drafter
from specbench.speculation.cost import CostCurve

ROOT = Path(__file__).resolve().parents[1]
CASES = [("tr", {}), ("tr_adaptive", {}), ("tr_adaptive", {"confidence": False}), ("tr_fused", {}),
         ("tr_fused", {"retrieval": "suffix"}), ("tr_fused", {"retrieval": "suffix", "suffix_global": True, "calibrate": True})]


def compare(a_path: str, b_path: str) -> int:
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    differ = 0
    for key in a:
        same = a[key] == b.get(key)
        differ += not same
        print(f"{key}: {'identical' if same else 'DIFFERENT'} (tokens, accepted lengths, rows, statistics)")
    return 1 if differ or set(a) != set(b) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--curve", help="a cost curve JSON (e.g. results/cpu-tasks/cost_curve.json)")
    ap.add_argument("--questions", default=str(ROOT.parent / "shared/data/spec_bench/question.jsonl"))
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    model, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), torch.float32)
    eos = eos_token_ids(model, tok)
    curve = CostCurve.load(args.curve)
    qs = [json.loads(line) for line in open(args.questions)][:200:40]
    code = inspect.getsource(textwrap.dedent)  # this Python's own: the same prompt whichever checkout runs
    texts = [q["turns"][0] for q in qs] + [f"Return this code unchanged:\n{code}"]
    out = {}
    for temp in (0.0, 0.7):
        for name, params in CASES:
            def build(sampler):
                return build_drafter(name, vocab_size=model.get_output_embeddings().weight.shape[0], device="cpu", model=model,
                                     model_name="smollm2-135m", dtype_name="float32", hardware_curve=curve, sampler=sampler, **params)
            d = build(None)
            runs, stats = [], []
            for i, t in enumerate(texts):
                ids = prompt_ids(tok, [{"role": "user", "content": t}])
                sampler = PositionSampler(temp, seed=3 + i) if temp else None
                if temp:
                    d = build(sampler)  # a drafter per question, coupled to its sampler
                d.start_question()
                r = Engine(model, eos).generate(ids, d, 48, sampler)
                runs.append({"tokens": r.tokens, "accept": r.accept_lengths, "rows": r.step_rows})
                stats.append(d.take_statistics())
            out[f"{name}{params}-T{temp}"] = {"runs": runs, "stats": stats}
            print(name, params, temp, sum(sum(x["accept"]) for x in runs) / sum(len(x["accept"]) for x in runs), flush=True)
    Path(args.out).write_text(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A drafter's own host time per decoding step, `propose` and `observe` apart (not a test).

    python scripts/bench_drafting.py [--methods tr_fused,pld,suffix] [--temperatures 0,0.7] [--tokens 128]
    python scripts/bench_drafting.py --methods suffix tr_fused:retrieval=suffix
    python scripts/bench_drafting.py --methods tr_fused,tr --tr-kernels kernel,torch
    python scripts/bench_drafting.py --lookup --context 2048 [--sweep]
    python scripts/bench_drafting.py --suffix-trees --context 1600

The default replays real decoding: the embedded SmolLM2-135M decodes Spec-Bench's first question of
each subtask (the test sample, or SPECBENCH_QUESTIONS) with each method, as a run does (the engine,
the run's cost curve for this machine and forward, the position-keyed sampler at T > 0, the drafter
hot across questions after one warm-up question that is not counted). Every `propose` and `observe`
call the engine makes is timed around the drafter's own code; the table gives the mean ms per step
of each, their sum, and the median of the sum. A coupled drafter (tr_adaptive, tr_fused at T > 0) reads
the sampler's position-keyed noise inside `propose`: entry by entry where the sampler's kernel runs, else
as whole rows the verifier draws for the same positions anyway and then finds drawn, so their cost moves
rather than adds; the table shows those rows apart. The forward is eager unless --compiled; the drafter's
inputs (tokens, the verified rows' logits) are the same either way.

Each timed decoding is also recorded (every `propose`'s state and draft, every `observe`'s outcome) and
replayed into a fresh drafter of the same settings with no forward between the calls: the replay's
columns are the drafter's host time with the host's caches its own, as on a GPU's host, where the
forward runs on the device; live, each CPU forward streams the model's weights through the caches
first. The recorded logits, though, are read from memory rather than from a cache the forward has just
filled, so a drafter that reads many verified rows a step (TR's 81) observes slower replayed than live.
The replay checks that every step drafts what the live decoding drafted (`same drafts`), so it also tells
whether a change to a drafter kept its drafts. With `--evict-mb N` a second replay reads N MB of memory
before each `observe`, untimed, where live the forward runs, and then the verified rows' logits (the
forward's output, in the caches live): the drafter's own data then starts each call as cold as live,
so that replay tells how much of the gap between live and replayed is the drafter's data evicted by the
forward (what it leaves unexplained, this sweep does not tell apart).

`--lookup` times `propose` alone at a fixed context of real text (PLD's n-gram search over the whole
context, REST's suffix-array lookup and trie) and, with --sweep, how it grows with the context.

`--suffix-trees` times the suffix trees alone, ours against arctic-inference's where it imports
(drafting/suffix_backends.py): a turn of real text (the questions' tokens, the first half its prompt)
replayed token by token, each step a draft (`speculate`) and the decided token appended (`extend`),
with Suffix Decoding's path settings (vLLM's) and the tree `tr_fused retrieval=suffix` asks for.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import os
import pstats
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from specbench.decoding.engine import Engine
from specbench.drafting import row_summary
from specbench.decoding.sampling import PositionSampler
from specbench.draft import DecodeState
from specbench.drafter import Target
from specbench.inputs.chat import prompt_ids
from specbench.inputs.models import eos_token_ids, load_model, named_model_config
from specbench.inputs.tasks import MINI, load_jsonl_questions, select_per_subtask
from specbench.registry import build_drafter, drafter_class
from specbench.speculation.cost import CostCurve, curve_for

from head_to_head import parse_method  # scripts/: `name:key=value,..` as head_to_head takes it

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "fixtures" / "spec_bench_sample.jsonl"


def timed_calls(drafter, times: dict[str, list[float]], profiler=None) -> None:
    """Time every `propose` and `observe` the engine makes on `drafter` into `times` (and profile
    them with `profiler`); an instance attribute, so the drafter's class and capabilities stay what
    the engine checks."""
    for name in ("propose", "observe"):
        inner = getattr(drafter, name)

        def call(arg, inner=inner, into=times[name]):
            if profiler is not None:
                profiler.enable()
            t0 = time.perf_counter()
            out = inner(arg)
            into.append(time.perf_counter() - t0)
            if profiler is not None:
                profiler.disable()
            return out

        setattr(drafter, name, call)


def timed_noise(sampler, into: list[float]) -> None:
    """Time the noise rows a drafter reads from the sampler (`noise_row`, which only drafters call): rows
    the verifier would draw for the same positions anyway, and then finds drawn."""
    inner = sampler.noise_row

    def call(position, vocab):
        t0 = time.perf_counter()
        out = inner(position, vocab)
        into.append(time.perf_counter() - t0)
        return out

    sampler.noise_row = call


def recorded_calls(drafter, events: list) -> None:
    """Record every `propose` (its state, copied, and the draft it made) and `observe` (its outcome, the
    logits copied) into `events`, outside whatever timing wraps the calls already: the engine reuses
    its buffers, a replay needs the values of the moment."""
    propose, observe = drafter.propose, drafter.observe

    def call_propose(state):
        draft = propose(state)
        events.append(("propose", replace(state, tokens=state.tokens.clone()), draft))
        return draft

    def call_observe(outcome):
        events.append(("observe", replace(outcome, logits=outcome.logits.clone(), accepted=list(outcome.accepted),
                                          emitted=list(outcome.emitted),
                                          hidden_states=None if outcome.hidden_states is None
                                          else outcome.hidden_states.clone())))
        return observe(outcome)

    drafter.propose, drafter.observe = call_propose, call_observe


def same_draft(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return bool(torch.equal(a.tokens.cpu(), b.tokens.cpu())) and tuple(a.tree.parents) == tuple(b.tree.parents)


def make_drafter(method: str, temperature: float, model, curve):
    sampler = PositionSampler(temperature, seed=0) if temperature > 0 else None
    if sampler is not None:
        sampler.prepare(model.device)
    target = Target(vocab_size=model.get_output_embeddings().weight.shape[0], device=model.device, model=model,
                    model_name="smollm2-135m", dtype_name="float32", hardware_curve=curve, sampler=sampler)
    name, settings = parse_method(method)
    cls = drafter_class(name)
    return cls(target, cls.Settings(**cls.check_settings({**cls.parameters(), **settings}, {}))), sampler


def per_step_ms(times: dict, steps: int) -> dict:
    per_step = [p + o for p, o in zip(times["propose"], times["observe"])]
    return {"propose_ms": 1e3 * sum(times["propose"]) / max(steps, 1),
            "observe_ms": 1e3 * sum(times["observe"]) / max(steps, 1),
            "noise_ms": 1e3 * sum(times["noise"]) / max(steps, 1),
            "total_ms": 1e3 * sum(per_step) / max(steps, 1),
            "median_ms": 1e3 * statistics.median(per_step) if per_step else 0.0}


def replay(method: str, temperature: float, model, engine, curve, questions, max_new: int, profiler=None,
           events: list | None = None, evict_mb: int = 0) -> dict:
    """Decode every question with one hot drafter, the first untimed; ms per step of its calls, live and
    replayed (`replay_recorded`; the recorded calls into `events` when given; with `evict_mb`, replayed
    again with the data caches swept before each `observe`)."""
    drafter, sampler = make_drafter(method, temperature, model, curve)
    times: dict[str, list[float]] = {"propose": [], "observe": [], "noise": []}
    events = [] if events is None else events
    steps = tokens = 0
    for i, (qid, ids) in enumerate(questions):
        if sampler is not None:
            sampler.bind(qid, 0)
        drafter.start_question()
        events.append(("start", qid, i == 1))
        if i <= 1:
            for name in ("propose", "observe"):  # the class's own calls again, to wrap afresh
                drafter.__dict__.pop(name, None)
        if i == 1:  # the warm-up question is done: count from here
            timed_calls(drafter, times, profiler)
            if sampler is not None:
                timed_noise(sampler, times["noise"])
        if i <= 1:  # around the timing, so copying the recorded values is not timed
            recorded_calls(drafter, events)
        out = engine.generate(list(ids), drafter, max_new, sampler)
        if i >= 1:
            steps += len(out.accept_lengths)
            tokens += len(out.tokens)
    again = replay_recorded(method, temperature, model, curve, events)
    evicted = replay_recorded(method, temperature, model, curve, events, evict_mb) if evict_mb else {}
    return {"method": method, "temperature": temperature, "steps": steps, "mat": tokens / max(steps, 1),
            **per_step_ms(times, steps), **{f"replay_{k}": v for k, v in again.items()},
            **{f"evicted_{k}": v for k, v in evicted.items()}}


def replay_recorded(method: str, temperature: float, model, curve, events: list, evict_mb: int = 0) -> dict:
    """The recorded calls into a fresh drafter, back to back: ms per step as `replay`'s, and how many
    steps drafted what the live decoding drafted (all of them, or the replay is not that decoding).
    `evict_mb`: read that much memory before each `observe`, untimed (where live the forward runs)."""
    drafter, sampler = make_drafter(method, temperature, model, curve)
    sweep = np.ones(evict_mb << 18, dtype=np.float32) if evict_mb else None
    times: dict[str, list[float]] = {"propose": [], "observe": [], "noise": []}
    same = steps = 0
    draft = None
    timed = False
    for event in events:
        if event[0] == "start":
            _, qid, start_timing = event
            if sampler is not None:
                sampler.bind(qid, 0)
            drafter.start_question()
            if start_timing:
                timed_calls(drafter, times)
                if sampler is not None:
                    timed_noise(sampler, times["noise"])
                timed = True
        elif event[0] == "propose":
            _, state, recorded = event
            draft = drafter.propose(state)
            steps += timed
            same += timed and same_draft(draft, recorded)
        else:  # the engine verified no draft for an empty tree: the outcome says which it was
            outcome = event[1]
            if sweep is not None:
                sweep.sum()  # every cache line of it through the caches, evicting the drafter's data
                outcome.logits.sum()  # then the verified rows, which live the forward has just written
            drafter.observe(replace(outcome, draft=None if outcome.draft is None else draft))
    return {**per_step_ms(times, steps), "same_drafts": same, "steps": steps}


def replay_all(args) -> list[dict]:
    torch.set_num_threads(args.threads)
    model, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), torch.float32)
    engine = Engine(model, eos_token_ids(model, tok), compiled=args.compiled)
    # a fixed curve makes runs comparable step for step (the quick curve is measured anew each time)
    curve = CostCurve.load(args.cost_curve) if args.cost_curve else curve_for(model, "smollm2-135m", "float32", engine=engine)
    path = args.questions or SAMPLE
    picked = select_per_subtask(load_jsonl_questions(path), 1)
    questions = [(q.question_id, prompt_ids(tok, [{"role": "user", "content": q.turns[0]}])) for q in picked]
    rows = []
    print("| method | T | TR kernels | steps | MAT | propose ms/step | of which noise rows | observe ms/step "
          "| total ms/step | total less noise rows | median total ms | replayed: propose | observe "
          "| total less noise rows | same drafts |" + (" replayed, caches swept: total less noise rows |"
                                                     if args.evict_mb else ""))
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
          + ("---:|" if args.evict_mb else ""))
    profiles = []
    for temperature, method, summary in itertools.product(args.temperatures, args.methods, args.tr_kernels):
        if summary == "torch":
            os.environ[row_summary.ENV] = "torch"
        else:
            os.environ.pop(row_summary.ENV, None)
        row_summary.kernel_ready.cache_clear()
        if summary == "kernel" and not row_summary.kernel_ready():
            raise SystemExit("error: --tr-kernels kernel, but our kernels do not build here (see the warning above)")
        profiler = cProfile.Profile() if args.profile else None
        r = replay(method, temperature, model, engine, curve, questions, args.tokens, profiler, evict_mb=args.evict_mb)
        r["tr_kernels"] = summary
        rows.append(r)
        print(f"| {method} | {temperature:g} | {summary} | {r['steps']} | {r['mat']:.2f} | {r['propose_ms']:.3f} | "
              f"{r['noise_ms']:.3f} | {r['observe_ms']:.3f} | {r['total_ms']:.3f} | "
              f"{r['total_ms'] - r['noise_ms']:.3f} | {r['median_ms']:.3f} | {r['replay_propose_ms']:.3f} | "
              f"{r['replay_observe_ms']:.3f} | {r['replay_total_ms'] - r['replay_noise_ms']:.3f} | "
              f"{r['replay_same_drafts']}/{r['replay_steps']} |"
              + (f" {r['evicted_total_ms'] - r['evicted_noise_ms']:.3f} |" if args.evict_mb else ""), flush=True)
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
            profiles.append(f"## {method} T={temperature:g} ({summary}): the drafter's calls by own time\n"
                            f"{out.getvalue()}")
    print("\n".join(profiles))
    return rows


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def real_text(args, tok) -> list[int]:
    """At least --context tokens of the questions' text, end to end (repeated when short)."""
    qs = load_jsonl_questions(args.questions) if args.questions else list(MINI)
    ids: list[int] = []
    while len(ids) < args.context:
        for q in qs:
            ids += tok(" ".join(q.turns)).input_ids
    return ids


# (max_depth, max_cached, max_tokens, factor, offset, min_prob, use_tree) as suffix_trees takes them
SUFFIX_TREE_SETTINGS = {"path (suffix, vLLM's)": (24, 0, 24, 1.0, 0.0, 0.1, False),
                        "tree (tr_fused retrieval=suffix)": (24, 0, 16, 4.0, 0.0, 0.1, True)}


def suffix_tree_times(args) -> dict:
    """ms per step of the suffix trees alone, each backend that imports here, twice each in the order
    python, arctic, arctic, python (the machine's drift then lands on both)."""
    from specbench.drafting.suffix_backends import arctic_problem, suffix_trees

    _, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), torch.float32)
    ids = real_text(args, tok)[: args.context]
    prompt, answer = ids[: len(ids) // 2], ids[len(ids) // 2 :]
    backends = ["python", "arctic", "arctic", "python"] if arctic_problem() is None else ["python", "python"]
    times: dict = {}
    for backend in backends:
        for name, settings in SUFFIX_TREE_SETTINGS.items():
            trees, context = suffix_trees(backend, *settings), list(prompt)
            trees.start_turn(np.array(prompt))
            t0 = time.perf_counter()
            for token in answer:
                trees.speculate(np.array(context[-settings[0]:]))
                trees.extend(np.array([token]))
                context.append(token)
            per_step = 1e3 * (time.perf_counter() - t0) / len(answer)
            times.setdefault(name, {}).setdefault(backend, []).append(per_step)
    missing = "" if arctic_problem() is None else f"; arctic-inference: {arctic_problem()}"
    print(f"suffix trees alone, ms per step (speculate + extend), a turn of {len(prompt)} prompt and "
          f"{len(answer)} answer tokens{missing}")
    for name, row in times.items():
        print(f"{name}: " + ", ".join(f"{b} {statistics.mean(v):.3f} ms ({', '.join(f'{x:.3f}' for x in v)})"
                                       for b, v in row.items()))
    return {"context": len(ids), "ms_per_step": times}


def lookup(args) -> dict:
    """`propose` alone of PLD and REST at fixed contexts of real text."""
    model, tok = load_model(named_model_config("smollm2-135m"), torch.device("cpu"), torch.float32)
    ids = real_text(args, tok)
    vocab = model.get_output_embeddings().weight.shape[0]
    drafters = {name: build_drafter(name, vocab_size=vocab, device="cpu", model=model,
                                    model_name="smollm2-135m", dtype_name="float32")
                for name in ("pld", "rest")}
    lengths = [n for n in (256, 512, 1024, 2048, 4096, 8192) if n < args.context] if args.sweep else []
    res = {"context": args.context, "repeats": args.repeats, "ms_per_propose": {}}
    for n in [*lengths, args.context]:
        seq = torch.tensor(ids[:n], dtype=torch.long)
        state = DecodeState(tokens=seq, prompt_len=n // 2, step=1)
        row = {name: median_ms(lambda d=d: d.propose(state), args.repeats) for name, d in drafters.items()}
        res["ms_per_propose"][n] = row
        print(f"context {n:5d}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row.items()))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=["tr_fused,pld,suffix"], nargs="+",
                    help="methods, comma-separated, or one each with its settings: tr_fused:retrieval=suffix,calibrate=true")
    ap.add_argument("--temperatures", default="0,0.7", type=lambda s: [float(t) for t in s.split(",")])
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per question")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the done-when's: one)")
    ap.add_argument("--cost-curve", default=None, help="a run's cost_curve.json (default: the quick curve, measured)")
    ap.add_argument("--tr-kernels", default=["kernel"], type=lambda s: s.split(","),
                    help="kernel, torch or both (kernel,torch): TR's row summary and template expansion on our "
                         "CPU kernels or on torch's and numpy's ops, side by side in one process "
                         "(drafting/row_summary.py, drafting/recycling.py)")
    ap.add_argument("--compiled", action="store_true", help="the compiled forward (default: eager)")
    ap.add_argument("--evict-mb", type=int, default=0, metavar="N",
                    help="also replay with N MB read before each observe, untimed (live, the forward runs there; "
                         "more than the last-level cache sweeps it)")
    ap.add_argument("--questions", default=None, help="question.jsonl (default: the tests' Spec-Bench sample)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile the drafter's calls and print the N functions with the most own time "
                         "(the timings then include the profiler's overhead)")
    ap.add_argument("--lookup", action="store_true", help="time propose alone at a fixed context (PLD, REST)")
    ap.add_argument("--suffix-trees", action="store_true", help="time the suffix trees alone, ours and arctic's")
    ap.add_argument("--context", type=int, default=2048, help="--lookup: the context length; --suffix-trees: the turn's")
    ap.add_argument("--repeats", type=int, default=200, help="--lookup: calls per figure")
    ap.add_argument("--sweep", action="store_true", help="--lookup: also 256, 512, 1024, ... up to --context")
    ap.add_argument("--out", default=None, help="the figures as JSON")
    args = ap.parse_args(argv)
    args.methods = [m for spec in args.methods for m in ([spec] if ":" in spec else spec.split(","))]
    res = lookup(args) if args.lookup else suffix_tree_times(args) if args.suffix_trees else replay_all(args)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

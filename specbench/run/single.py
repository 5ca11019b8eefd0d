"""One benchmark run: a method on a task with a model, AR interleaved question by question.

Interleaving (AR on question i, then the method on question i) keeps slow drift of the machine
(thermal, other load) from favouring either side. Both sides' answers are appended as they
finish, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.decoding.engine import Engine
from specbench.decoding.sampling import PositionSampler
from specbench.config import RunConfig, RunPlan
from specbench.drafter import ReadsHiddenStates
from specbench.inputs.chat import answer_text, prompt_ids
from specbench.markdown import markdown_table
from specbench.inputs.questions import Question
from specbench.inputs.tasks import WARMUP_QUESTION, load_task
from specbench.inputs.window import check_prompts_fit, model_context_length
from specbench.registry import build_drafter, drafter_class
from specbench.run import baselines, lossless, memory, metrics
from specbench.run.plan import check_identity, identity, results_dir_for, run_identity
from specbench.run.results_io import append_jsonl, repair_jsonl, write_json_atomic
from specbench.run.target import load_engine, make_sampler, method_drafter_factory, run_cost_curve
from specbench.speculation import cost, roofline


def prompt_bound(tokenizer, q: Question, template: str, max_new: int) -> int:
    """An upper bound on the longest prompt any turn of `q` can have: the last turn's conversation
    with empty answers (roles alternate, as strict chat templates demand), each answer then counted
    at max_new tokens plus a few for re-tokenising its text. Exact for a one-turn question."""
    messages = []
    for t in q.turns:
        messages += [{"role": "user", "content": t}, {"role": "assistant", "content": ""}]
    ids = prompt_ids(tokenizer, messages[:-1], template)
    return len(ids) + (len(q.turns) - 1) * (max_new + 16)


def longest_prompt_bound(tokenizer, questions: list[Question], template: str, max_new: int) -> int:
    """The largest prompt_bound of these questions (0 for none)."""
    return max((prompt_bound(tokenizer, q, template, max_new) for q in questions), default=0)


def check_questions_fit(tokenizer, questions: list[Question], template: str, max_new: int,
                        context_length: int | None, model_name: str) -> None:
    """InputError, before anything is timed, naming the first question whose first-turn prompt and
    max_new tokens run past the model's window (inputs/window.py). A later turn's prompt holds
    the answers before it, known only as it starts: the engine checks it then (step.check_context), as
    refusing on a bound would refuse Spec-Bench's two-turn questions on a 2k-window model whose answers
    fit."""
    if not context_length:
        return
    first = [(q.question_id, q.subtask, len(prompt_ids(tokenizer, [{"role": "user", "content": q.turns[0]}],
                                                          template))) for q in questions]
    check_prompts_fit(first, max_new, context_length, model_name)


def reserve_compiled_cache(engine: Engine, methods: list[type], tokenizer, questions: list[Question],
                           template: str, max_new: int) -> None:
    """Compile (CUDA: record), before anything is timed, the one cache capacity every turn of the run
    fits in. A new capacity met mid-run means minutes of compiling (outside the clock, but inside the
    sweep's wall time) and, with CUDA graphs, a row bucket's graphs and buffers more per capacity: on
    a long context or a large model, memory. Spare capacity costs the CPU-compiled forward nothing and
    a CUDA graph a few masked columns."""
    if engine.compiled is None or not questions:
        return
    longest = longest_prompt_bound(tokenizer, questions, template, max_new)
    for hidden in sorted({issubclass(m, ReadsHiddenStates) for m in methods}):
        engine.new_cache(longest, max_new, hidden, reserve=True)


def run_question(engine: Engine, drafter, tokenizer, q: Question, template: str, max_new: int,
                 sampler: PositionSampler | None = None) -> dict:
    """All turns of one question; turn 2 sees the model's own turn-1 answer, as in Spec-Bench."""
    drafter.start_question()
    messages: list[dict] = []
    turns = []
    shared = memory.target_parts(engine.model)  # the target's weights are no drafter's state
    for turn_idx, text in enumerate(q.turns):
        messages.append({"role": "user", "content": text})
        ids = prompt_ids(tokenizer, messages, template)
        if sampler is not None:
            sampler.bind(q.question_id, turn_idx)
        memory.start_turn(engine.device)
        r = engine.generate(ids, drafter, max_new, sampler, measure_cache=memory.kv_cache_bytes)
        answer = answer_text(tokenizer, r.tokens)  # as Spec-Bench keeps it for turn 2
        messages.append({"role": "assistant", "content": answer})
        turns.append({
            "prompt_ids": ids, "input_tokens": len(ids), "output": answer, "token_ids": r.tokens,
            "new_tokens": r.new_tokens, "wall_time": r.wall_time, "prefill_time": r.prefill_time,
            "decoding_steps": r.decoding_steps, "accept_lengths": r.accept_lengths, "step_rows": r.step_rows,
            "step_drafted": r.step_drafted, "step_times": r.step_times,
            **memory.turn_memory(r.kv_cache_bytes, drafter, engine.device, shared),
        })
    rec = {"question_id": q.question_id, "category": q.category, "subtask": q.subtask,
           "method": drafter.name, "turns": turns}
    stats = drafter.take_statistics()  # what the drafter counted on this question (TR: per node)
    if stats:
        rec["drafter_stats"] = stats
    return rec


def _stored(record: dict) -> dict:
    """What goes to answers.jsonl: prompt ids are derivable and long, so they stay in memory."""
    out = dict(record)
    out["turns"] = [{k: v for k, v in t.items() if k != "prompt_ids"} for t in record["turns"]]
    return out


def summarize(plan: RunPlan, records: list[dict], base: list[dict], checks: list[dict],
              curve: cost.CostCurve | None = None, lossless_method: bool = True,
              questions: int | None = None) -> dict:
    """`questions`: how many the run asked (the lossless verdict's denominator; default: the records)."""
    cfg = plan.settings
    ids = {r["question_id"] for r in records}
    bound = cost.run_bound(curve, records)
    base = [b for b in base if b["question_id"] in ids]
    ci = metrics.speedup_ci(records, base) if base else None
    summary = {
        "method": plan.method, "method_params": cfg.method_settings,
        "lossless_method": lossless_method,  # false: lossy by design, outside the lossless tally
        "model": cfg.model.name, "task": cfg.task.name, "temperature": cfg.temperature,
        "top_k": cfg.top_k, "top_p": cfg.top_p,
        "dtype": cfg.dtype, "device": plan.device_name, "max_new_tokens": cfg.max_new_tokens,
        "questions": len(records),
        "new_tokens": sum(t["new_tokens"] for r in records for t in r["turns"]),
        "wall_time": sum(t["wall_time"] for r in records for t in r["turns"]),
        "tokens_per_s": metrics.tokens_per_s(records),
        "decode_tokens_per_s": metrics.tokens_per_s(records, decode_only=True),
        "mat": metrics.mat(records),
        "rows_per_step": metrics.rows_per_step(records),
        "subtasks": metrics.subtasks(records),  # the order of every per-subtask figure (metrics.ordered_subtasks)
        "subtask_mat": {s: metrics.mat([r for r in records if r["subtask"] == s]) for s in metrics.subtasks(records)},
        "baseline": cfg.baseline,
        "baseline_tokens_per_s": metrics.tokens_per_s(base) if base else None,
        "speedup": metrics.speedup(records, base) if base else None,
        "speedup_ci": list(ci) if ci else None,  # 95%, bootstrap over questions
        # definitions: specbench/run/metrics.py, docs/protocol.md
        "acceptance": {
            "histogram": metrics.accept_length_histogram(records),
            "drafted_token_rate": metrics.drafted_acceptance_rate(records),
            "by_depth": metrics.acceptance_by_depth(records),
            "mat_per_step": metrics.mat(records), "mat_per_question": metrics.mat_per_question(records),
        },
        "latency": {"ttft": metrics.ttft(records), "per_token": metrics.per_token_latency(records),
                    "tpot_per_question": metrics.tpot(records)},
        "decode_speedup": metrics.speedup(records, base, decode_only=True) if base else None,
        # per subtask: input tokens, speedups, MAT, acceptance, prefill time apart from decode, memory peaks
        "by_subtask": metrics.subtask_figures(records, base),
        # the largest turn's, over the run (run/memory.py; None where no turn recorded it)
        "memory": {k: metrics.memory_peak(records, k) for k in metrics.MEMORY_KEYS},
        # the speedup with zero harness overhead on this hardware (specbench/speculation/cost.py); against
        # decode_speedup, the gap is what drafting, verification and bookkeeping cost
        "speedup_bound": bound["bound"] if bound else None,
        "speedup_bound_detail": bound,
        "forward_vs_floor": roofline.forward_vs_floor(curve, bound and bound["mean_rows"]),  # t(w) / roofline
        "lossless": lossless.tally(checks, len(records) if questions is None else questions),
        "lossless_details": [dict(r["lossless"], question_id=r["question_id"]) for r in records
                             if r.get("lossless", {}).get("status", "exact") not in ("exact", "unchecked")
                             or r.get("lossless", {}).get("tokens", {}).get("tokens_outside_band")],
        "drafter_stats": metrics.sum_statistics([r.get("drafter_stats") for r in records]),
        "warmup": cfg.warmup, "warmup_on": cfg.warmup_on,
        "forward": plan.forward, "host_memory": cfg.host_memory,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return summary


def format_table(summary: dict) -> str:
    cols = [s for s in summary.get("subtasks") or [k for k in summary["speedup"] or {} if k != "overall"]
            if summary["speedup"] and s in summary["speedup"]]
    head = ["method", *cols, "overall", "decode", "bound", "MAT", "tokens/s", "lossless"]
    sp = summary["speedup"] or {}
    dec = (summary.get("decode_speedup") or {}).get("overall")
    bound = summary.get("speedup_bound")
    lo = summary["lossless"]
    row = [summary["method"], *[f"{sp[c]:.2f}x" for c in cols],
           f"{sp['overall']:.2f}x" if sp.get("overall") else "-", f"{dec:.2f}x" if dec else "-",
           f"{bound:.2f}x" if bound else "-", f"{summary['mat']:.2f}",
           f"{summary['tokens_per_s']:.1f}",
           (lossless.verdict_line(lo) if summary.get("lossless_method", True) else
            f"lossy by design: {lo['exact']}/{lo['checked']} equal to AR")]
    rows = [head, row]
    if summary["baseline_tokens_per_s"]:
        rows.insert(1, ["ar", *["1.00x"] * len(cols), "1.00x", "1.00x", "1.00x", "1.00",
                        f"{summary['baseline_tokens_per_s']:.1f}", "reference"])
    out = [markdown_table(rows[0], rows[1:], pad=True)]
    detail = summary.get("speedup_bound_detail")
    if detail:
        c = detail["cost_curve"]
        out.append(f"decode = speedup without prefill; bound = MAT x t(1) / t(rows), step by step, from the "
                   f"{'quick ' if c['quick'] else ''}cost curve of {c['device']} ({c['dtype']}, t(1) = "
                   f"{c['t1_ms']:.1f} ms, {detail['mean_rows']:.1f} rows per step); decode vs bound: harness overhead")
    out.append(acceptance_latency_line(summary))
    out += roofline.footer_lines(summary)
    if summary["method"] == "tr" and sp.get("overall") and sp["overall"] < 1:
        rows = f"{detail['mean_rows']:.0f}-row " if detail else ""
        out.append(f"TR is below 1x here: on this hardware a forward over its {rows}tree costs more than the "
                   "tokens it recycles save. Try method=tr_adaptive, which verifies each step the part of the "
                   "tree that pays on this machine's cost curve (docs/token-recycling.md).")
    return "\n".join(out)


def subtask_table(summary: dict) -> str:
    """Per subtask: questions, mean input tokens, speedup and decode speedup, MAT, drafted-token
    acceptance, mean prefill time (method / AR), and the memory of the largest turn: KV cache, drafter
    state, and the device's peak where CUDA measured one."""
    figures = summary.get("by_subtask") or {}
    peaks = any(f.get("peak_device_bytes") is not None for f in figures.values())
    head = ["subtask", "questions", "input tokens", "speedup", "decode", "MAT", "acc. rate",
            "prefill ms (method / AR)", "KV cache", "drafter state", *(["peak device"] if peaks else [])]
    rows = []
    for sub, f in figures.items():
        prefill = [_number(f[k], "{:.0f}", 1000) for k in ("prefill_time", "baseline_prefill_time")]
        rows.append([sub, f["questions"], _number(f["input_tokens"], "{:.0f}"), _number(f["speedup"], "{:.2f}x"),
                     _number(f["decode_speedup"], "{:.2f}x"), f"{f['mat']:.2f}",
                     _number(f["drafted_token_rate"], "{:.1%}"), " / ".join(prefill),
                     format_bytes(f["kv_cache_bytes"]), format_bytes(f["drafter_state_bytes"]),
                     *([format_bytes(f["peak_device_bytes"])] if peaks else [])])
    return markdown_table(head, rows, pad=True, align="lrrrrrrrrr" + "r" * peaks)


def _number(value, fmt: str, scale: float = 1) -> str:
    return "-" if value is None else fmt.format(value * scale)


def format_bytes(n: int | None) -> str:
    """Bytes in the largest unit they fill (B, KiB, MiB, GiB); '-' for None."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def acceptance_latency_line(summary: dict) -> str:
    """The table's footer line of acceptance and latency figures ('-' where the answers lack them)."""
    acc, lat, ci = summary.get("acceptance") or {}, summary.get("latency") or {}, summary.get("speedup_ci")
    ms = lambda v: "-" if v is None else f"{1000 * v:.1f} ms"
    rate = acc.get("drafted_token_rate")
    per_token = lat.get("per_token") or {}
    return (f"accepted {'-' if rate is None else f'{100 * rate:.1f}%'} of drafted tokens; "
            f"TTFT p50 {ms((lat.get('ttft') or {}).get('p50'))}; "
            f"per-token latency p50 {ms(per_token.get('p50'))}, p99 {ms(per_token.get('p99'))}; "
            f"speedup 95% CI {f'{ci[0]:.2f}x-{ci[1]:.2f}x' if ci else '-'} (bootstrap over questions)")


@dataclass
class RunInProgress:
    """What one run holds while it runs: its plan, directory, model, engine and drafters."""

    plan: RunPlan  # its settings as this machine runs them (config.RunPlan)
    questions: list[Question]
    out_dir: Path
    done: dict  # question id -> record, resumed or made by this run
    model: object = None
    tok: object = None
    engine: Engine | None = None
    curve: cost.CostCurve | None = None
    drafter: object = None
    ar: object = None
    sampler: PositionSampler | None = None
    band: dict | None = None  # the measured rounding band the lossless check uses (rounding_band.py)

    @property
    def cfg(self) -> RunConfig:
        return self.plan.settings

    @property
    def method(self) -> str:
        return self.plan.method

    @property
    def todo(self) -> list[Question]:
        return [q for q in self.questions if q.question_id not in self.done]

    def answer(self, drafter, q: Question) -> dict:
        return run_question(self.engine, drafter, self.tok, q, self.cfg.model.chat_template,
                            self.cfg.max_new_tokens, self.sampler)


def run_single(plan: RunPlan) -> "Finished":
    """One request at a time, as planned (run/plan.py): run, write answers and summary, print the table."""
    run = open_run_directory(plan)
    baseline = baseline_for(run)
    load_target_and_drafters(run)
    measure_rounding_band(run)  # before anything is timed (cached per model, device, dtype, forward)
    cfg = run.cfg  # the settings as planned (a step down while loading included)
    if run.todo and cfg.warmup:
        warm_up(cfg.warmup, cfg.warmup_on, run.engine, [run.ar] if run.method == "ar" else [run.ar, run.drafter],
                run.tok, run.questions, cfg.model.chat_template, cfg.max_new_tokens, run.sampler)
    answer_questions(run, baseline)
    return finish(run, baseline)


def write_run_config(run: "RunInProgress") -> None:
    """run_config.json: the run's identity, its settings as planned, and the rounding band it measured."""
    band = {k: run.band[k] for k in ("band_ulps", "band_logits", "measured_ulps", "measured_logits", "safety",
                                     "forward", "cached") if k in run.band} if run.band else None
    write_json_atomic(run.out_dir / "run_config.json", {"identity": run_identity(run.plan),
                                                        "config": run.plan.recorded(),
                                                        **({"rounding_band": band} if band else {})})


def open_run_directory(plan: RunPlan) -> RunInProgress:
    """The run's directory: refused if it holds answers of other settings, else its config written
    and its finished answers read back (a rerun resumes)."""
    import weakref

    from specbench.run.results_io import make_directory
    from specbench.run.run_lock import lock_run_directory

    cfg = plan.settings
    out_dir = make_directory(Path(plan.results_dir))
    # one run per directory: a second one is refused naming this one; released with the run (or the process)
    lock = lock_run_directory(out_dir)
    try:
        # a run's own answers also depend on the method and its settings (AR references do not)
        check_identity(out_dir, run_identity(plan))
        done = {r["question_id"]: r for r in repair_jsonl(out_dir / "answers.jsonl")}
        run = RunInProgress(plan, load_task(cfg.task), out_dir, done)
        write_run_config(run)
    except BaseException:
        lock.release()
        raise
    weakref.finalize(run, lock.release)
    return run


def baseline_for(run: RunInProgress):
    """The `baseline` setting's strategy (specbench/run/baselines.py)."""
    cfg = run.cfg
    if run.method == "ar" or cfg.baseline == "none":
        return baselines.Baseline()
    if cfg.baseline == "reuse":
        ar_dir = results_dir_for(cfg, "ar")
        check_identity(ar_dir, identity(run.plan), missing_ok=True)  # finished AR answers, only read
        return baselines.Reused(ar_dir, [q.question_id for q in run.questions])
    if cfg.baseline == "shared":
        return baselines.Shared(results_dir_for(cfg, "ar"), dict(identity(run.plan), method="ar", method_params={}),
                                run.plan.recorded())
    return baselines.Interleaved(run.out_dir / "baseline_answers.jsonl")


def load_target_and_drafters(run: RunInProgress) -> None:
    """The model and its engine (compiled before anything is timed), the cost curve, the drafters."""
    cfg = run.cfg
    run.model, run.tok, run.engine = load_engine(run.plan)
    # a prompt that with max_new_tokens runs past the window is refused before anything compiles or is timed
    check_questions_fit(run.tok, run.todo, cfg.model.chat_template, cfg.max_new_tokens,
                        run.engine.context_length or model_context_length(cfg.model), cfg.model.name)
    reserve_compiled_cache(run.engine, [drafter_class("ar"), drafter_class(run.method)], run.tok, run.todo,
                           cfg.model.chat_template, cfg.max_new_tokens)
    if run.engine.forward_name != run.plan.forward:  # compiling the model failed: the engine went on eager
        run.plan = run.plan.stepped_down(run.engine.forward_name)
        cfg = run.cfg
        check_identity(run.out_dir, run_identity(run.plan))  # answers resumed from the compiled forward do not mix
        write_run_config(run)
    # measured at the contexts the run's turns reach, so the bound and the goodput choices price a step
    # at its own context (speculation/cost.py contexts_for)
    longest = longest_prompt_bound(run.tok, run.questions, cfg.model.chat_template, cfg.max_new_tokens)
    run.curve = run_cost_curve(cfg, run.model, run.engine,
                               cost.contexts_for(longest, cfg.max_new_tokens, run.engine.context_length))
    if run.curve is not None:
        run.curve.save(run.out_dir / "cost_curve.json")
    run.sampler = make_sampler(cfg)
    run.drafter = method_drafter_factory(cfg, run.model, run.curve, run.sampler)()
    run.ar = build_drafter("ar")


def measure_rounding_band(run: RunInProgress) -> None:
    """The lossless check's rounding band on this model, device, dtype and forward: loaded from the
    cache or measured (seconds), stored in run_config.json and the summary; none when nothing is checked."""
    from specbench.run.rounding_band import load_or_measure

    cfg = run.cfg
    if not cfg.lossless.check:
        return
    model_key = cfg.model.name + (f"-{hashlib.sha256(str(cfg.model.path).encode()).hexdigest()[:8]}"
                                        if cfg.model.path else "")
    run.band = load_or_measure(run.model, run.tok, model_key, run.plan.device_name, cfg.dtype,
                               engine=run.engine, template=cfg.model.chat_template)
    write_run_config(run)


def ar_goes_first(run: RunInProgress, q: Question) -> bool:
    """AR and the method alternate which answers first, question by question (by the question's place
    in the task, so a resumed run keeps the order): neither always runs right after the previous
    question's check forwards, or always on a machine the other has just warmed."""
    return [x.question_id for x in run.questions].index(q.question_id) % 2 == 0


def answer_questions(run: RunInProgress, baseline) -> None:
    """Each question not yet answered: AR's answer as the baseline gives it and the method's, in
    alternating order, the lossless check against AR, the record appended at once (an interrupted run
    loses nothing)."""
    from tqdm.auto import tqdm

    cfg = run.cfg
    todo = run.todo
    bar = tqdm(total=len(run.questions), initial=len(run.questions) - len(todo), desc=run.method,
               unit="q", disable=not cfg.progress, dynamic_ncols=True)
    for q in todo:
        ar_first = ar_goes_first(run, q)
        if ar_first:
            base_rec = baseline.answer(q.question_id, lambda: run.answer(run.ar, q), _stored)
        rec = run.answer(run.drafter if run.method != "ar" else run.ar, q)
        if not ar_first:
            base_rec = baseline.answer(q.question_id, lambda: run.answer(run.ar, q), _stored)
        rec["first"] = "ar" if ar_first or not baseline.active else "method"
        if baseline.active and cfg.lossless.check:
            if "prompt_ids" not in base_rec["turns"][0]:  # resumed or reused: rebuild the prompts
                base_rec = _with_prompts(base_rec, q, run.tok, cfg.model.chat_template)
            rec["lossless"] = lossless.compare_question(run.model, base_rec, rec, cfg.dtype, run.sampler,
                                                        q.question_id, run.band)
            if not run.drafter.lossless and rec["lossless"]["status"] != "exact":
                # a lossy-by-design option (Medusa's typical acceptance): a difference is expected
                rec["lossless"]["status"] = "lossy_difference"
        else:
            rec["lossless"] = {"status": "exact"} if run.method == "ar" else {"status": "unchecked"}
        if cfg.lossless.check:  # every emitted token, whatever AR did (outside the timed turns)
            rec["lossless"]["tokens"] = lossless.check_tokens(run.model, rec, cfg.dtype, run.sampler,
                                                              q.question_id, run.band)
        append_jsonl(run.out_dir / "answers.jsonl", _stored(rec))
        run.done[q.question_id] = rec
        recs = list(run.done.values())
        post = {"tok/s": f"{metrics.tokens_per_s(recs):.1f}", "MAT": f"{metrics.mat(recs):.2f}"}
        if baseline.active:
            post["speedup"] = f"{metrics.speedup(recs, list(baseline.answers.values()))['overall']:.2f}x"
        bar.set_postfix(post)
        bar.update(1)
    bar.close()


@dataclass
class Finished:
    """A finished run, for the reports made after it (specbench/main.py): its settings as the run
    resolved them, the summary, both sides' answers and the directory."""

    plan: RunPlan
    summary: dict
    records: list[dict]
    baseline: list[dict]
    out_dir: Path


def finish(run: RunInProgress, baseline) -> Finished:
    """The summary, written and printed as a table."""
    cfg = run.cfg
    records = [run.done[q.question_id] for q in run.questions]
    base = records if run.method == "ar" else (
        [baseline.answers[q.question_id] for q in run.questions] if baseline.active else [])
    checks = [r.get("lossless", {"status": "unchecked"}) for r in records]
    checks = [c for c in checks if c["status"] != "unchecked" or "tokens" in c]
    summary = summarize(run.plan, records, base, checks, run.curve, lossless_method=run.drafter.lossless,
                        questions=len(run.questions))
    summary["results_dir"] = str(run.out_dir)
    summary["rounding_band"] = run.band  # measured on this model, device, dtype and forward (None: unchecked)
    # who answered first, per question (AR and the method alternate); resumed records made before the
    # alternation have no 'first'
    summary["order"] = {"mode": "alternating" if baseline.active else "single",
                        "first": {str(r["question_id"]): r.get("first") for r in records}}
    if run.engine.compiled is not None:  # compiling happened before timing; a recompile while timed shows here
        summary["compile_seconds"] = round(run.engine.compiled.compile_seconds, 1)
        summary["recompiles_while_timed"] = run.engine.compiled.recompiles()
    summary["repeat"] = cfg.repeat
    if baseline.directory is not None:
        summary["baseline_dir"] = str(baseline.directory)
    write_json_atomic(run.out_dir / "summary.json", summary)
    print(format_table(summary))
    print(subtask_table(summary))
    if run.band:
        b = run.band
        print(f"rounding band: {b['band_ulps']:.3g} ulps of each row's largest logit (measured {b['measured_ulps']:.3g} "
              f"x {b['safety']:g} on this {b.get('forward', 'eager')} forward{', cached' if b.get('cached') else ''}; "
              f"{b['band_logits']:.3g} logits where measured); numeric tokens "
              f"{summary['lossless'].get('tokens_numeric', 0)}/{summary['lossless'].get('tokens_checked', 0)}")
    nan = float("nan")
    for d in summary["lossless_details"]:
        if d["status"] not in ("exact", "unchecked"):
            print(f"  {d['status']}: question {d['question_id']} turn {d['turn']} position {d['position']} "
                  f"(AR top-2 margin {d.get('ar_top2_margin', nan):.3g}, method token rank "
                  f"{d.get('method_token_rank', '?')} at {d.get('method_gap_to_top', nan):.3g} below the top, float32 margin "
                  f"{d.get('float32_margin', nan):.3g}, band {d.get('band', nan):.3g})")
        bad = d.get("tokens", {}).get("first_outside")
        if bad:
            print(f"  outside the band: question {d['question_id']} turn {bad['turn']} token {bad['index']} "
                  f"(margin {bad['margin']:.3g} to the target's choice, band {bad['band']:.3g})")
    print(f"results: {run.out_dir}")
    return Finished(run.plan, summary, records, base, run.out_dir)


def warm_up(count: int, on: str, engine: Engine, drafters: list, tok, questions: list[Question], template: str,
            max_new: int, sampler: PositionSampler | None) -> None:
    """`count` (the `warmup` setting) generations per drafter before anything is timed, on what
    `warmup_on` names.

    builtin (default): on a prompt that is in no task, then every drafter is reset to its freshly
    built state, so what a drafter learns across questions (TR's hot-start matrix) comes from
    measured questions only. first_question: Spec-Bench's protocol, all turns of the first question
    and no reset, so a learning drafter has seen that question's answer before it is timed."""
    first = on == "first_question"
    warm_q = questions[0] if first else WARMUP_QUESTION
    for _ in range(count):
        for d in drafters:
            run_question(engine, d, tok, warm_q, template, max_new, sampler)
    if not first:
        for d in drafters:
            d.reset()


def _with_prompts(rec: dict, q: Question, tok, template: str) -> dict:
    """Rebuild a stored record's prompt ids from the question and the record's own earlier answers."""
    messages: list[dict] = []
    turns = []
    for text, turn in zip(q.turns, rec["turns"]):
        messages.append({"role": "user", "content": text})
        turns.append(dict(turn, prompt_ids=prompt_ids(tok, messages, template)))
        messages.append({"role": "assistant", "content": turn["output"]})
    return dict(rec, turns=turns)



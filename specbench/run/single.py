"""One benchmark run: a method on a task with a model, one request at a time, AR interleaved question by
question.

The session (run/session.py) holds the folder, the target, the band and the timing guard; the loop
(run/question_loop.py) answers and checks each question; the summary (run/summary.py) is computed
from the answers; main.py prints it (report/console.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specbench.config import RunPlan
from specbench.registry import build_drafter
from specbench.run import baselines
from specbench.run.plan import check_identity, identity, results_dir_for
from specbench.run.question_loop import answer_questions, warm_up
from specbench.run.results_io import repair_jsonl, write_json_atomic
from specbench.run.session import SINGLE, Session, open_session
from specbench.run.summary import summarize
from specbench.run.timing_guard import TimingGuard


@dataclass
class Finished:
    """A finished run, for the reports made after it (specbench/main.py): its plan as the run resolved
    it, the summary, both sides' answers and the directory."""

    plan: RunPlan
    summary: dict
    records: list[dict]
    baseline: list[dict]
    out_dir: Path
    device: TimingGuard  # the device's timing lock, still held shared: released once the reports are written


def run_single(plan: RunPlan) -> Finished:
    """One request at a time, as planned (run/plan.py): warm up, answer, summarize, write the summary."""
    session = open_session(plan, SINGLE)
    try:
        done = {r["question_id"]: r for r in repair_jsonl(session.folder / "answers.jsonl")}  # a rerun resumes
        baseline = baseline_for(session)
        drafter, ar = session.drafter_factory(session.sampler)(), build_drafter("ar")
        cfg = session.cfg  # the settings as planned (a step down while loading included)
        if len(done) < len(session.questions) and cfg.warmup:
            with session.timing.timed():
                warm_up(cfg.warmup, cfg.warmup_on, session.engine, [ar] if plan.method == "ar" else [ar, drafter],
                        session.tok, session.questions, cfg.model.chat_template, cfg.max_new_tokens,
                        session.sampler, cfg.prefix_cache)
        answer_questions(session, baseline, drafter if plan.method != "ar" else ar, ar, done)
        finished = finish(session, baseline, drafter, done)
        session.handover()  # the folder let go; the timing guard (finished.device) stays held for the reports
        return finished
    finally:
        session.close()


def baseline_for(session: Session) -> baselines.Baseline:
    """The `baseline` setting's strategy (specbench/run/baselines.py)."""
    plan, cfg = session.plan, session.cfg
    ids = [q.question_id for q in session.questions]
    if plan.method == "ar" or cfg.baseline == "none":
        return baselines.Baseline()
    if cfg.baseline == "reuse":
        ar_dir = results_dir_for(cfg, "ar")
        check_identity(ar_dir, identity(plan), missing_ok=True)  # finished AR answers, only read
        return baselines.Reused(ar_dir, ids)
    if cfg.baseline == "shared":
        return baselines.Shared(results_dir_for(cfg, "ar"), dict(identity(plan), method="ar", method_params={}),
                                plan.recorded(), provenance=session.timing.provenance,
                                waiting=session.timing.waiting)
    return baselines.Interleaved(session.folder / "baseline_answers.jsonl")


def finish(session: Session, baseline: baselines.Baseline, drafter, done: dict) -> Finished:
    """The summary, with what the run's conditions were, written atomically."""
    plan, cfg = session.plan, session.cfg
    records = [done[q.question_id] for q in session.questions]
    base = records if plan.method == "ar" else (
        [baseline.answers[q.question_id] for q in session.questions] if baseline.active else [])
    checks = [r.get("lossless", {"status": "unchecked"}) for r in records]
    checks = [c for c in checks if c["status"] != "unchecked" or "tokens" in c]
    summary = summarize(plan, records, base, checks, session.curve, lossless_method=drafter.lossless,
                        questions=len(session.questions))
    summary["results_dir"] = str(session.folder)
    summary["rounding_band"] = session.band  # measured on this model, device, dtype and forward (None: unchecked)
    # who answered first, per question (AR and the method alternate); resumed records made before the
    # alternation have no 'first'
    summary["order"] = {"mode": "alternating" if baseline.active else "single",
                        "first": {str(r["question_id"]): r.get("first") for r in records}}
    compiled = session.engine.compiled
    if compiled is not None:  # compiling happened before timing; a recompile while timed shows here
        summary["compile_seconds"] = round(compiled.compile_seconds, 1)
        summary["recompiles_while_timed"] = compiled.recompiles()
    summary["repeat"] = cfg.repeat
    if baseline.directory is not None:
        summary["baseline_dir"] = str(baseline.directory)
    summary["timing"] = session.timing.summary(records, [] if plan.method == "ar" else base)
    write_json_atomic(session.folder / "summary.json", summary)
    return Finished(plan, summary, records, base, session.folder, session.timing)

"""A serving run: the task's questions as concurrent requests (`batch_size=B` > 1 or `request_rate=`).

Each question's first turn is one request (a later turn's prompt holds the model's own earlier
answer, so it could only arrive once that answer is done: serving measurements take first turns, as
SmartSpec does). At most `batch_size` decode together (continuous batching, decoding/batched.py),
all waiting at t = 0 or arriving by a seeded Poisson process at `request_rate` per second.

Side by side in one process, on the eager forward: batched AR on the same requests, batch size and
arrivals (the speedup's baseline; `baseline=none` skips it), then the method, each after an untimed
warm-up batch whose drafters are thrown away (nothing learnt there reaches a timed request). Each
side is one timed unit, written atomically when it finishes; a rerun reuses a finished side. Outside
the clock every request is checked as the single-request runner checks a question: against its
batch-size-1 AR output (the single-request engine), and every emitted token against the target's
choice within the rounding band (run/lossless.py).

Files: <results_root>/<model>/<task>/serving/<method>-t0-m<M>-b<B>[-rps<rate>][-goodput][-bf16|-fp16][~settings]/
serving_config.json, ar_batch.json, method_batch.json (per request: tokens, times, accept lengths),
summary.json; after the run, serving/serving.md and serving/plots/ gather every serving run beside it
(report/serving_report.py, through main.py).
"""

from __future__ import annotations

import dataclasses
import time

from specbench.run import lossless
from specbench.run.results_io import read_json, write_json_atomic
from specbench.run.serving_metrics import poisson_arrivals, serving_figures
from specbench.config import RunConfig, RunPlan
from specbench.run.session import SERVING, Session, open_session
from specbench.run.timing_guard import TimingGuard
from specbench.decoding.batched import BatchedEngine, DrafterPool, Request
from specbench.speculation.batch_policy import BatchCost, BatchGoodput, FixedSpeculation, measure_batch_cost
from specbench.inputs.chat import first_turn, prompt_ids
from specbench.inputs.tasks import WARMUP_QUESTION
from specbench.registry import build_drafter


def run_serving(plan: RunPlan) -> tuple[dict, TimingGuard]:
    """Both sides timed, every output checked, summary written and printed. Returns the summary and the
    device's timing guard, still held shared: released once the reports are written (main.py)."""
    session = open_session(plan, SERVING)
    try:
        summary = _serve(session)
        return summary, session.handover()
    finally:
        session.close()


def _serve(session: Session) -> dict:
    cfg, method, out_dir = session.cfg, session.plan.method, session.folder
    questions = session.questions
    prompts = [prompt_ids(session.tok, first_turn(q), cfg.model.chat_template) for q in questions]
    policy = lambda: FixedSpeculation()  # noqa: E731
    if cfg.batch_speculation == "goodput":
        cost = batch_cost(session, cfg.batch_size)
        policy = lambda: BatchGoodput(cost)  # noqa: E731
    build_method = session.drafter_factory()
    sides = ServingSides(session, BatchedEngine(session.model, session.engine.eos), prompts, policy)
    with_ar = method != "ar" and cfg.baseline != "none"
    ar_side = sides.timed(lambda: build_drafter("ar"), "ar") if with_ar or method == "ar" else None
    side = ar_side if method == "ar" else sides.timed(build_method, "method")
    checks = (check_requests(cfg, session.model, session.engine, prompts, questions, side["requests"], session.band)
              if cfg.lossless.check else [])
    summary = serving_summary(session.plan, side, ar_side if with_ar else None, checks)
    summary["results_dir"] = str(out_dir)
    summary["rounding_band"] = session.band
    # each side is one timed unit: the summary counts contended sides
    summary["timing"] = session.timing.summary([side], [ar_side] if with_ar else [])
    write_json_atomic(out_dir / "summary.json", summary)
    print(f"results: {out_dir}")  # the table follows from report/serving_report.py (main.py)
    return summary


class ServingSides:
    """Each side (batched AR, the method) as one timed unit, written atomically when it finishes; a
    rerun reuses a finished side."""

    def __init__(self, session: Session, batched: BatchedEngine, prompts: list, policy):
        self.session, self.batched, self.prompts, self.policy = session, batched, prompts, policy
        cfg = session.cfg
        self.arrivals = poisson_arrivals(len(prompts), cfg.request_rate, cfg.seed)

    def timed(self, build_drafter_, name: str) -> dict:
        session, cfg = self.session, self.session.cfg
        path = session.folder / f"{name}_batch.json"
        if path.is_file():  # finished before an interruption: its timing stands
            return read_json(path)  # a request missing from it fails the check (check_requests)
        warm_prompt = prompt_ids(session.tok, [{"role": "user", "content": WARMUP_QUESTION.turns[0]}],
                                 cfg.model.chat_template)
        warm = [Request(warm_prompt, cfg.max_new_tokens, DrafterPool(build_drafter_))] * min(2, cfg.batch_size)
        with session.timing.timed() as load:
            for _ in range(min(cfg.warmup, 1)):
                self.batched.generate(warm, cfg.batch_size, self.policy())
            pool = DrafterPool(build_drafter_)  # fresh drafters: the warm-up's learning is thrown away
            chosen = self.policy()
            result = self.batched.generate([Request(p, cfg.max_new_tokens, pool, None, a)
                                            for p, a in zip(self.prompts, self.arrivals, strict=True)],
                                           cfg.batch_size, chosen)
        side = self.side_record(result, chosen, name, load)
        write_json_atomic(path, side)
        return side

    def side_record(self, result, chosen, name: str, load: dict) -> dict:
        cfg = self.session.cfg
        margin = {"min_gain": chosen.min_gain} if isinstance(chosen, BatchGoodput) and name == "method" else {}
        return {"figures": serving_figures(result), "policy": cfg.batch_speculation if name == "method" else "fixed",
                **margin, "timing": load,
                "requests": [dict(dataclasses.asdict(r), question_id=q.question_id)
                             for r, q in zip(result.records, self.session.questions, strict=True)],
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}


def batch_cost(session: Session, batch_size: int) -> BatchCost:
    """t(B, R) for the goodput policy, measured once per run directory up to its batch size, alone on
    the device (its timings price every step)."""
    path = session.folder / "batch_cost.json"
    if path.is_file():
        return BatchCost.load(path)
    batches = sorted({1, batch_size} | {b for b in (2, 4, 8, 16, 32, 64) if b < batch_size})
    with session.timing.timed():
        measured = measure_batch_cost(session.model, batches=tuple(batches))
    return BatchCost.load(measured.save(path))


def check_requests(cfg: RunConfig, model, engine, prompts, questions, requests: list[dict],
                   band: dict | None = None) -> list[dict]:
    """Each request against its batch-size-1 AR output, and every emitted token against the target's choice
    within the run's measured rounding band (`band`; None: the assumed one). A question without its
    request, or a request of no question, is a mismatch (nothing is skipped)."""
    checks = []
    by_id = {r.get("question_id"): r for r in requests}
    asked = {q.question_id for q in questions}
    for stray in [r for r in requests if r.get("question_id") not in asked]:
        checks.append(missing_request(stray.get("question_id"), "a request of no question in this run's task"))
    for p, q in zip(prompts, questions, strict=True):
        r = by_id.get(q.question_id)
        if r is None:
            checks.append(missing_request(q.question_id, "no request recorded for this question"))
            continue
        ref = engine.generate(p, build_drafter("ar"), cfg.max_new_tokens).tokens
        ar_rec = {"turns": [{"prompt_ids": p, "token_ids": ref}]}
        rec = {"turns": [{"prompt_ids": p, "token_ids": r["tokens"]}]}
        c = lossless.compare_question(model, ar_rec, rec, cfg.dtype, None, q.question_id, band)
        c["tokens"] = lossless.check_tokens(model, rec, cfg.dtype, None, q.question_id, band)
        checks.append(dict(c, question_id=q.question_id))
    return checks


def missing_request(question_id, why: str) -> dict:
    """The check of a request that is missing (or has no question): a mismatch, counted and reported."""
    nothing = {"tokens_checked": 0, "tokens_equal": 0, "tokens_numeric": 0, "tokens_outside_band": 0,
               "first_outside": None}
    return {"status": "mismatch", "reason": why, "question_id": question_id, "tokens": nothing}


def serving_summary(plan: RunPlan, side: dict, ar_side: dict | None, checks: list[dict]) -> dict:
    cfg = plan.settings
    fig, base = side["figures"], (ar_side or {}).get("figures")
    return {
        "method": plan.method, "method_params": cfg.method_settings, "model": cfg.model.name,
        "task": cfg.task.name, "dtype": cfg.dtype, "device": plan.device_name, "forward": plan.forward,
        "host_memory": cfg.host_memory,
        "max_new_tokens": cfg.max_new_tokens, "batch_size": cfg.batch_size,
        "request_rate": cfg.request_rate, "batch_speculation": cfg.batch_speculation, **fig,
        "baseline_throughput": base["throughput"] if base else None,
        "speedup": round(fig["throughput"] / base["throughput"], 3) if base else None,
        "latency_speedup": round(base["latency_mean"] / fig["latency_mean"], 3) if base else None,
        "baseline_latency_mean": base["latency_mean"] if base else None,
        "lossless": lossless.tally(checks),
        "lossless_details": [c for c in checks if c["status"] != "exact" or c["tokens"]["tokens_outside_band"]],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }

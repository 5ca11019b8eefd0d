"""The single run's loop: per question AR and the method, each timed alone on the device, checked
against each other outside the clock, appended at once (an interrupted run loses nothing).

Interleaving (AR on question i, then the method on question i, the order alternating) keeps slow drift
of the machine (thermal, other load) from favouring either side.
"""

from __future__ import annotations

from specbench.decoding.engine import Engine, KeptPrefix
from specbench.decoding.sampling import PositionSampler
from specbench.inputs.chat import answer_text, opening, prompt_ids
from specbench.inputs.questions import Question
from specbench.inputs.tasks import WARMUP_QUESTION
from specbench.run import lossless, memory, metrics
from specbench.run.results_io import append_jsonl
from specbench.run.session import Session


def run_question(engine: Engine, drafter, tokenizer, q: Question, template: str, max_new: int,
                 sampler: PositionSampler | None = None, prefix_cache: bool = False) -> dict:
    """All turns of one question; turn 2 sees the model's own turn-1 answer, as in Spec-Bench.
    `prefix_cache`: the question's KV cache kept from turn to turn (engine.KeptPrefix), this drafter's
    own: each turn prefills only what it adds."""
    drafter.start_question()
    kept = KeptPrefix() if prefix_cache else None
    messages = opening(q)  # a system prompt where the question has one (an agent's tool descriptions)
    turns = []
    shared = memory.target_parts(engine.model)  # the target's weights are no drafter's state
    for turn_idx, text in enumerate(q.turns):
        memory.start_turn(engine.device)
        messages.append({"role": "user", "content": text})
        ids = prompt_ids(tokenizer, messages, template)
        if sampler is not None:
            sampler.bind(q.question_id, turn_idx)
        r = engine.generate(ids, drafter, max_new, sampler, measure_cache=memory.kv_cache_bytes, prefix=kept)
        answer = answer_text(tokenizer, r.tokens)  # as Spec-Bench keeps it for turn 2
        messages.append({"role": "assistant", "content": answer})
        turns.append({
            "prompt_ids": ids, "input_tokens": len(ids), "output": answer, "token_ids": r.tokens,
            "new_tokens": r.new_tokens, "wall_time": r.wall_time, "prefill_time": r.prefill_time,
            **({"prefix_reused": r.prefix_reused} if kept is not None else {}),
            "decoding_steps": r.decoding_steps, "accept_lengths": r.accept_lengths, "step_rows": r.step_rows,
            "step_drafted": r.step_drafted, "step_times": r.step_times,
            # the drafter's host seconds per step, propose and observe apart, where the engine measured them
            **{k: getattr(r, k) for k in ("step_propose_times", "step_observe_times") if hasattr(r, k)},
            "phase_seconds": r.phase_seconds,  # the turn's steps by phase (decoding/step.py PHASES), summed
            **memory.turn_memory(r.kv_cache_bytes, drafter, engine.device, shared),
        })
    rec = {"question_id": q.question_id, "category": q.category, "subtask": q.subtask,
           "method": drafter.name, "turns": turns}
    stats = drafter.take_statistics()  # what the drafter counted on this question (TR: per node)
    if stats:
        rec["drafter_stats"] = stats
    return rec


def timed_answer(session: Session, drafter, q: Question) -> dict:
    """One question answered as a timed section: alone on the device, its load recorded beside it."""
    cfg = session.cfg
    with session.timing.timed() as load:
        rec = run_question(session.engine, drafter, session.tok, q, cfg.model.chat_template, cfg.max_new_tokens,
                           session.sampler, cfg.prefix_cache)
    rec["timing"] = load
    return rec


def warm_up(count: int, on: str, engine: Engine, drafters: list, tok, questions: list[Question], template: str,
            max_new: int, sampler: PositionSampler | None, prefix_cache: bool = False) -> None:
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
            run_question(engine, d, tok, warm_q, template, max_new, sampler, prefix_cache)
    if not first:
        for d in drafters:
            d.reset()


def ar_goes_first(questions: list[Question], q: Question) -> bool:
    """AR and the method alternate which answers first, question by question (by the question's place
    in the task, so a resumed run keeps the order): neither always runs right after the previous
    question's check forwards, or always on a machine the other has just warmed."""
    return [x.question_id for x in questions].index(q.question_id) % 2 == 0


def answer_questions(session: Session, baseline, drafter, ar, done: dict) -> None:
    """Each question not yet in `done` (question id -> record, updated here): both sides' answers in
    alternating order, the lossless check, the record appended at once."""
    from tqdm.auto import tqdm

    questions = session.questions
    todo = [q for q in questions if q.question_id not in done]
    bar = tqdm(total=len(questions), initial=len(questions) - len(todo), desc=session.plan.method,
               unit="q", disable=not session.cfg.progress, dynamic_ncols=True)
    for q in todo:
        ar_first = ar_goes_first(questions, q)
        run_ar = lambda q=q: timed_answer(session, ar, q)  # noqa: E731
        base_rec = baseline.answer(q.question_id, run_ar, stored) if ar_first else None
        rec = timed_answer(session, drafter, q)
        if not ar_first:
            base_rec = baseline.answer(q.question_id, run_ar, stored)
        rec["first"] = "ar" if ar_first or not baseline.active else "method"
        rec["lossless"] = check_question(session, drafter, q, rec, base_rec if baseline.active else None)
        append_jsonl(session.folder / "answers.jsonl", stored(rec))
        done[q.question_id] = rec
        bar.set_postfix(progress_figures(list(done.values()), baseline))
        bar.update(1)
    bar.close()


def check_question(session: Session, drafter, q: Question, rec: dict, base_rec: dict | None) -> dict:
    """Against AR's answer (where there is one) and every emitted token against the target's choice,
    within the run's measured rounding band; outside the clock."""
    cfg, method = session.cfg, session.plan.method
    if base_rec is not None and cfg.lossless.check:
        if "prompt_ids" not in base_rec["turns"][0]:  # resumed or reused: rebuild the prompts
            base_rec = with_prompts(base_rec, q, session.tok, cfg.model.chat_template)
        check = lossless.compare_question(session.model, base_rec, rec, cfg.dtype, session.sampler,
                                          q.question_id, session.band)
        if not drafter.lossless and check["status"] != "exact":
            # a lossy-by-design option (Medusa's typical acceptance): a difference is expected
            check["status"] = "lossy_difference"
    else:
        check = {"status": "exact"} if method == "ar" else {"status": "unchecked"}
    if cfg.lossless.check:  # every emitted token, whatever AR did
        check["tokens"] = lossless.check_tokens(session.model, rec, cfg.dtype, session.sampler, q.question_id,
                                                session.band)
    return check


def progress_figures(records: list[dict], baseline) -> dict:
    post = {"tok/s": f"{metrics.tokens_per_s(records):.1f}", "MAT": f"{metrics.mat(records):.2f}"}
    if baseline.active:
        post["speedup"] = f"{metrics.speedup(records, list(baseline.answers.values()))['overall']:.2f}x"
    return post


def stored(record: dict) -> dict:
    """What goes to answers.jsonl: prompt ids are derivable and long, so they stay in memory."""
    out = dict(record)
    out["turns"] = [{k: v for k, v in t.items() if k != "prompt_ids"} for t in record["turns"]]
    return out


def with_prompts(rec: dict, q: Question, tok, template: str) -> dict:
    """Rebuild a stored record's prompt ids from the question and the record's own earlier answers."""
    messages = opening(q)
    turns = []
    for text, turn in zip(q.turns, rec["turns"]):
        messages.append({"role": "user", "content": text})
        turns.append(dict(turn, prompt_ids=prompt_ids(tok, messages, template)))
        messages.append({"role": "assistant", "content": turn["output"]})
    return dict(rec, turns=turns)

"""The prompts' sizes, known before anything is timed: the bound every turn's cache fits in, and the
check that each question's first turn fits the model's window."""

from __future__ import annotations

from specbench.decoding.engine import Engine
from specbench.drafter import ReadsHiddenStates
from specbench.inputs.chat import first_turn, last_prompt_tokens, prompt_ids
from specbench.inputs.questions import Question
from specbench.inputs.window import check_prompts_fit, check_sessions_fit


def prompt_bound(tokenizer, q: Question, template: str, max_new: int) -> int:
    """An upper bound on the longest prompt any turn of `q` can have: the last turn's conversation
    with empty answers (roles alternate, as strict chat templates demand), each answer then counted
    at max_new tokens plus a few for re-tokenising its text. Exact for a one-turn question."""
    return last_prompt_tokens(tokenizer, q, template) + (len(q.turns) - 1) * (max_new + 16)


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
    first = [(q.question_id, q.subtask, len(prompt_ids(tokenizer, first_turn(q), template))) for q in questions]
    check_prompts_fit(first, max_new, context_length, model_name)
    # an agent's session (a system prompt, several turns) is long by design: the whole of it must fit
    sessions = [(q.question_id, q.subtask, len(q.turns), last_prompt_tokens(tokenizer, q, template))
                for q in questions if getattr(q, "system", None) and len(q.turns) > 1]
    check_sessions_fit(sessions, max_new, context_length, model_name)


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

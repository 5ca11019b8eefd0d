"""A model's context window, known before its weights load, and the prompts that fit in it with
max_new_tokens: a run is refused before anything is timed rather than stopped mid-question."""

from __future__ import annotations

from specbench.config import ModelConfig
from specbench.errors import InputError
from specbench.inputs.models import local_config_json


def model_context_length(model: ModelConfig) -> int | None:
    """The positions the model was trained for, known before loading: the model config's
    `context_length` (the embedded GGUF models), else max_position_embeddings of a local directory's
    config.json; None when neither says (the engine checks once the model has loaded)."""
    if model.context_length:
        return int(model.context_length)
    conf = local_config_json(model)
    if conf is None:
        return None
    n = conf.get("max_position_embeddings") or (conf.get("text_config") or {}).get("max_position_embeddings")
    return n if isinstance(n, int) and n > 0 else None


def check_context_length(model: ModelConfig, max_new_tokens: int) -> None:
    """max_new_tokens must leave room in the model's context for the prompt."""
    n = model_context_length(model)
    if n is not None and max_new_tokens >= n:
        raise InputError(f"max_new_tokens={max_new_tokens} is beyond the context of model {model.name} "
                         f"({n} positions, prompt included); set max_new_tokens below {n}")


def check_prompts_fit(prompts: list[tuple], max_new_tokens: int, context_length: int | None,
                      model_name: str) -> None:
    """InputError naming the first prompt that with max_new_tokens runs past the model's window, and
    the fix: the largest max_new_tokens every prompt fits with, or the subtasks whose prompts fit.
    prompts: (question id, subtask, prompt tokens) each. Nothing is checked where the window is
    unknown (None)."""
    if not context_length:
        return
    over = [p for p in prompts if p[2] + max_new_tokens > context_length]
    if not over:
        return
    qid, subtask, tokens = over[0]
    more = len(over) - 1
    others = f", as {'does' if more == 1 else 'do'} {more} more question{'s' * (more > 1)}" if more else ""
    fits = context_length - max(n for _, _, n in prompts)
    fixes = [f"set max_new_tokens to at most {fits}"] if fits >= 1 else []
    short = list(dict.fromkeys(p[1] for p in prompts if p[1] not in {o[1] for o in over}))
    fixes.append(f"keep the subtasks that fit (task.subtasks=[{','.join(short)}])" if short else
                 "use shorter prompts")
    raise InputError(f"question {qid!r} (subtask {subtask}): its prompt of {tokens} tokens and max_new_tokens="
                     f"{max_new_tokens} need {tokens + max_new_tokens} positions, beyond the context of model "
                     f"{model_name} ({context_length} positions){others}; {' or '.join(fixes)}")


def check_sessions_fit(sessions: list[tuple], max_new_tokens: int, context_length: int | None,
                       model_name: str, per_answer: int = 16) -> None:
    """InputError naming the first session that cannot finish in the model's window with every answer
    at max_new_tokens, and the largest max_new_tokens every session finishes with. For tasks whose
    sessions are long by design (task=agent_loop: tool outputs and answers pile up over 4-5 turns),
    where a first-turn check would let a run start that fails at its third turn.
    sessions: (question id, subtask, number of turns, the last turn's prompt tokens with every answer
    empty) each; `per_answer`: the tokens an answer's template and re-tokenising may add. Nothing is
    checked where the window is unknown (None)."""
    if not context_length:
        return

    def need(turns: int, empty: int, new: int) -> int:
        return empty + (turns - 1) * (new + per_answer) + new

    over = [s for s in sessions if need(s[2], s[3], max_new_tokens) > context_length]
    if not over:
        return
    qid, subtask, turns, empty = over[0]
    fits = min((context_length - e - per_answer * (t - 1)) // t for _, _, t, e in sessions)
    fix = f"set max_new_tokens to at most {fits}" if fits >= 1 else "use a model with a longer window"
    more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
    raise InputError(f"session {qid!r} (subtask {subtask}){more}: {turns} turns of {empty} prompt tokens and "
                     f"{turns} answers of max_new_tokens={max_new_tokens} need up to "
                     f"{need(turns, empty, max_new_tokens)} positions, beyond the context of model {model_name} "
                     f"({context_length} positions); {fix}")

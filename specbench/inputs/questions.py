"""A question and the checks every loader applies to one: Spec-Bench's subtask columns, a question's
turns and id, and jsonl lines read as JSON objects."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specbench.errors import InputError, SettingsError

SUBTASKS = ("mt", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def subtask_of(category: str) -> str:
    """Spec-Bench's six columns: MT-bench's eight categories form 'mt'; the others are their own."""
    return "mt" if category in MT_BENCH_CATEGORIES else category


@dataclass
class Question:
    question_id: str | int
    category: str
    turns: list[str]
    # a subtask the source names itself (task=long's input-length buckets); None: Spec-Bench's column
    # of the category
    subtask_name: str | None = None
    # the conversation's system prompt (task=agent_loop's tool descriptions); None: the chat template's
    # own default, as every Spec-Bench question has (inputs/chat.py opening)
    system: str | None = None

    @property
    def subtask(self) -> str:
        return self.subtask_name if self.subtask_name is not None else subtask_of(self.category)


def json_objects(path: Path, lines, error: type[Exception], hint: str = ""):
    """(line number, object) for every non-blank line of a jsonl file; a line that is not a JSON
    object raises `error` naming the file and line (`hint` says what a line must be)."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{path}:{lineno}: not valid JSON ({e.msg}){hint}") from None
        if not isinstance(d, dict):
            raise error(f"{path}:{lineno}: expected a JSON object, got {type(d).__name__}")
        yield lineno, d


def checked_question(where: str, here: str, qid, category, turns, subtask, seen: dict,
                     turns_name: str = "'turns'", system=None) -> Question:
    """One question, refused (naming `where`: file and line or row) unless its turns are non-empty
    text, its system prompt (if any) too, and its id is a string or number not in `seen` (id ->
    `here`, e.g. 'line 3', where it was first), which it joins."""
    if isinstance(turns, str):
        turns = [turns]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise SettingsError(f"{where}: {turns_name} must be a non-empty list of strings")
    empty = [i + 1 for i, t in enumerate(turns) if not t.strip()]
    if empty:
        raise InputError(f"{where}: question {qid!r} has an empty turn "
                         f"(turn {', '.join(map(str, empty))}); every turn must hold text")
    if not isinstance(qid, (str, int, float)) or isinstance(qid, bool):
        raise InputError(f"{where}: question_id must be a string or a number, got {qid!r}")
    if qid in seen:
        raise InputError(f"{where}: duplicate question_id {qid!r} (first on {seen[qid]}); "
                         f"each question needs its own id (answers are paired with AR's by it)")
    if subtask is not None and (isinstance(subtask, bool) or not isinstance(subtask, (str, int))
                                or not str(subtask).strip()):
        raise SettingsError(f"{where}: subtask must be a non-empty string, got {subtask!r}")
    if system is not None and (not isinstance(system, str) or not system.strip()):
        raise SettingsError(f"{where}: system must be a non-empty string (the system prompt), got {system!r}")
    seen[qid] = here
    return Question(qid, "default" if category is None else str(category), turns,
                    None if subtask is None else str(subtask), system)

"""Question sets: Spec-Bench's question.jsonl, a built-in mini set, user jsonl files, the tasks committed
under data/ (long inputs, code edits, agent sessions) and any dataset (datasets_task.py)."""

from __future__ import annotations

from pathlib import Path

from specbench.errors import MissingFileError, SettingsError
from specbench.inputs.questions import Question, checked_question, json_objects

# Our own prompts, two per subtask, short enough for a CPU smoke run.
MINI = [
    Question("mini-mt-1", "writing", ["Write a short poem about a lighthouse keeper.",
                                      "Now rewrite the poem so that every line rhymes."]),
    Question("mini-mt-2", "reasoning", ["If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain.",
                                        "Give another example of the same kind of reasoning."]),
    Question("mini-translation-1", "translation", ["Translate German to English: Der Zug nach Berlin fährt um acht Uhr ab, aber heute hat er Verspätung."]),
    Question("mini-translation-2", "translation", ["Translate German to English: Wir haben im Garten Tomaten, Bohnen und Kürbisse gepflanzt."]),
    Question("mini-summarization-1", "summarization", ["Summarize the following text in two sentences: The town council met on Tuesday to discuss the new bicycle lanes. Several residents spoke in favour, citing safer commutes for children, while shop owners worried about losing parking spaces. After two hours of debate, the council voted to build the lanes on two streets as a trial and to review the results next spring."]),
    Question("mini-summarization-2", "summarization", ["Summarize: A team of volunteers cleaned the river banks over the weekend, collecting more than three hundred kilograms of plastic. The organisers said the amount was lower than last year, which they credit to new recycling bins installed near the park."]),
    Question("mini-qa-1", "qa", ["What is the boiling point of water at sea level in degrees Celsius?"]),
    Question("mini-qa-2", "qa", ["Which planet in our solar system is known as the Red Planet?"]),
    Question("mini-math_reasoning-1", "math_reasoning", ["A baker makes 12 loaves a day and sells each for 3 dollars. How much money does she make in a week? Think step by step."]),
    Question("mini-math_reasoning-2", "math_reasoning", ["Tom has 5 apples. He gives 2 to Anna and buys 7 more. How many apples does Tom have now? Explain your steps."]),
    Question("mini-rag-1", "rag", ["Context: The Eiffel Tower was completed in 1889 for the World's Fair and is 330 metres tall. Question: When was the Eiffel Tower completed?"]),
    Question("mini-rag-2", "rag", ["Context: Honey bees communicate the location of flowers through a waggle dance. Question: How do honey bees tell each other where flowers are?"]),
]

# The default warm-up prompt: in no task (not Spec-Bench, not mini), so warming up teaches a
# learning drafter nothing about a measured question (see runner.warm_up).
WARMUP_QUESTION = Question("warmup", "writing", [
    "Describe, in a few sentences, how a kettle brings water to the boil, and list three ways to "
    "save energy when making tea."])


# The tasks committed under data/, each built by scripts/make_<kind>_task.py (data/<kind>/README.md):
# long inputs, code edits, agent sessions.
DATA = Path(__file__).resolve().parents[2] / "data"
LONG_TASK = DATA / "long" / "long.jsonl"
CODE_EDIT_TASK = DATA / "code_edit" / "code_edit.jsonl"
AGENT_LOOP_TASK = DATA / "agent_loop" / "agent_loop.jsonl"
COMMITTED_TASKS = {"long": LONG_TASK, "code_edit": CODE_EDIT_TASK, "agent_loop": AGENT_LOOP_TASK}
TASK_KINDS = ("mini", "spec_bench", "jsonl", *COMMITTED_TASKS, "dataset")


def load_jsonl_questions(path: str | Path) -> list[Question]:
    """Read Spec-Bench-style jsonl: question_id, category, turns (a list of user turns), an optional
    subtask (else Spec-Bench's column of the category) and an optional system prompt."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(
            f"question file '{path}' not found. Spec-Bench's question.jsonl comes from the Spec-Bench "
            f"repository (data/spec_bench/question.jsonl); point task.path at a local copy."
        )
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise SettingsError(f"{path}: not UTF-8 text (byte {e.start}); each line must be one JSON object") from None
    questions = []
    seen: dict = {}  # question id -> its line
    for lineno, d in json_objects(path, lines, SettingsError, "; each line must be one JSON object"):
        missing = [k for k in ("question_id", "turns") if k not in d]
        if missing:
            raise SettingsError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}; each question needs "
                                f"question_id, category and turns")
        questions.append(checked_question(f"{path}:{lineno}", f"line {lineno}", d["question_id"],
                                          str(d.get("category", "default")), d["turns"], d.get("subtask"), seen,
                                          system=d.get("system")))
    if not questions:
        raise SettingsError(f"{path}: no questions in file")
    return questions


def select_per_subtask(questions: list[Question], n: int | None) -> list[Question]:
    """The first n questions of each subtask, in file order."""
    if n is None:
        return questions
    if n < 1:
        raise SettingsError(f"task.per_subtask must be at least 1, got {n}")
    counts: dict[str, int] = {}
    out = []
    for q in questions:
        if counts.get(q.subtask, 0) < n:
            counts[q.subtask] = counts.get(q.subtask, 0) + 1
            out.append(q)
    return out


def load_task(cfg) -> list[Question]:
    from specbench.config import TaskConfig, typed

    task = typed(TaskConfig, cfg)
    kind = task.kind
    if kind == "mini":
        questions = list(MINI)
    elif kind in ("spec_bench", "jsonl"):
        if not task.path:
            raise SettingsError(
                f"task '{task.name}' needs task.path=<question.jsonl> (or SPECBENCH_QUESTIONS=...); "
                f"Spec-Bench's file is data/spec_bench/question.jsonl in the Spec-Bench repository"
            )
        questions = load_jsonl_questions(task.path)
    elif kind in COMMITTED_TASKS:
        # read as plain jsonl (the file holds the dataset's columns as they are named): a run of it
        # needs no `datasets`, which only wrote it
        path = COMMITTED_TASKS[kind]
        if not task.path and not path.is_file():  # an install without the checkout's data/
            raise MissingFileError(f"task={kind} reads {path}, which is not there; pass task.path=<a copy of "
                                   f"data/{kind}/{path.name}> or rebuild it with scripts/make_{kind}_task.py")
        questions = load_jsonl_questions(task.path or path)
    elif kind == "dataset":
        from specbench.inputs.datasets_task import load_dataset_questions

        if not task.path:
            raise SettingsError("task=dataset needs task.path=<a folder saved with save_to_disk, a .json, "
                                ".jsonl or .parquet file or folder of them, or a hub id>")
        questions = load_dataset_questions(task.path, task.columns, task.split)
    else:
        raise SettingsError(f"unknown task kind '{kind}'. Valid kinds: {', '.join(TASK_KINDS)}")
    wanted = task.subtasks
    if wanted:
        wanted = [wanted] if isinstance(wanted, str) else list(wanted)
        present = sorted({q.subtask for q in questions})
        unknown = [s for s in wanted if s not in present]
        if unknown:
            raise SettingsError(f"task.subtasks names {', '.join(unknown)}, which task '{task.name}' does not "
                                f"have. Valid subtasks: {', '.join(present)}")
        questions = [q for q in questions if q.subtask in wanted]
    questions = select_per_subtask(questions, task.per_subtask)
    if task.limit is not None and task.limit < 1:
        raise SettingsError(f"task.limit must be at least 1 (a number of questions; null: all), got {task.limit}")
    if task.limit:
        questions = questions[: task.limit]
    return questions

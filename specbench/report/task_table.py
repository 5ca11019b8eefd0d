"""One compact table across tasks: each method's overall speedup and MAT per task and temperature.

The leaderboard tables (tables.py) are one per task, with a column per subtask. A reader comparing where
speculation pays (chat against code editing against agent loops) wants the tasks side by side instead:
a row per method (variant), a column per (temperature, task), each cell the mean overall speedup of the
method's repeated runs with its MAT. Built from the aggregated rows of any number of sweep folders, so
that a task measured in one sweep sits beside a task measured in another.
"""

from __future__ import annotations

import re

from specbench.markdown import markdown_table
from specbench.report import tables, timing_marks


def task_name(task: str | None) -> str:
    """'code_edit-ps2' -> 'code_edit', 'agent_loop-ps1-pc' -> 'agent_loop-pc': the task without its question
    selection, still marked where its turns ran on a kept cache (`prefix_cache=true`, collect.run_meta)."""
    return re.sub(r"-ps\d+(?=(-pc)?$)", "", task or "")


TASK_ORDER = ("spec_bench", "code_edit", "agent_loop", "long")


def columns(rows: list[dict]) -> list[tuple[float, str]]:
    """(temperature, task) pairs present, temperatures ascending, the tasks in `TASK_ORDER`, then by name; a
    task on a kept cache ('agent_loop-pc') right after the same task prefilled whole."""
    order = {t: i for i, t in enumerate(TASK_ORDER)}
    pairs = {(r["temperature"], task_name(r["task"])) for r in rows}

    def key(pair):
        base = pair[1].removesuffix("-pc")
        return pair[0], order.get(base, len(order)), base, pair[1] != base

    return sorted(pairs, key=key)


def label(row: dict) -> str:
    """The method, and where it departs from its defaults the settings that do ('tr_fused (retrieval=suffix)'):
    one label for a variant whichever sweep (and whichever settings it had then) ran it."""
    variant = tables.variant_label(row["method"], row.get("method_params"))
    return row["method"] if variant == "defaults" else f"{row['method']} ({variant})"


def cell_of(row: dict) -> tuple:
    """The table cell a run row belongs to: (method label, temperature, task)."""
    return label(row), row["temperature"], task_name(row["task"])


def cells(rows: list[dict]) -> dict[str, dict[tuple[float, str], dict]]:
    """label -> (temperature, task) -> the aggregated row; AR (every speedup 1) left out."""
    out: dict[str, dict] = {}
    for r in rows:
        if r["method"] != "ar":
            out.setdefault(label(r), {})[(r["temperature"], task_name(r["task"]))] = r
    return out


def interleaved_first(rows: list[dict]) -> list[dict]:
    """Run rows (before aggregating) less those a better-timed measurement supersedes: where a method (label)
    has runs with AR interleaved at a (temperature, task), its runs there against a shared AR are left out.
    A shared AR may have been timed hours earlier on a machine that has drifted since; the interleaved runs
    are the ones a cell should average, never a mix of both."""
    interleaved = {cell_of(r) for r in rows if r.get("baseline_mode") == "interleave"}
    return [r for r in rows if cell_of(r) not in interleaved or r.get("baseline_mode") == "interleave"]


def latest_root(rows: list[dict]) -> list[dict]:
    """Run rows less those a later sweep folder measured again: each row's `root` is the index of its
    folder among those given (oldest first), and a cell (method label, temperature, task) takes only the
    runs of the last folder that ran it. A cell measured again (new code, another day's machine, another
    cost curve) shows that measurement, never an average across days."""
    last: dict[tuple, int] = {}
    for r in rows:
        last[cell_of(r)] = max(last.get(cell_of(r), -1), r.get("root", 0))
    return [r for r in rows if r.get("root", 0) == last[cell_of(r)]]


def leaders(by_label: dict[str, dict], cols: list[tuple[float, str]], top: int) -> list[str]:
    """Every method best in some column, then the rest: those that ran in more columns first, then by mean
    speedup over the columns they ran in; `top` rows at most (never fewer than the column winners)."""
    def speed(label, col):
        r = by_label[label].get(col)
        return r.get("overall") if r and r.get("overall") is not None else None

    winners = []
    for col in cols:
        ran = [lab for lab in by_label if speed(lab, col) is not None]
        if ran:
            best = max(ran, key=lambda lab: speed(lab, col))
            if best not in winners:
                winners.append(best)

    def mean_speed(label):
        vals = [speed(label, c) for c in cols if speed(label, c) is not None]
        return sum(vals) / len(vals) if vals else 0.0

    def rank(label):
        return len([c for c in cols if speed(label, c) is not None]), mean_speed(label)

    rest = sorted((lab for lab in by_label if lab not in winners), key=rank, reverse=True)
    chosen = set(winners + rest[: max(top - len(winners), 0)])
    return sorted(chosen, key=rank, reverse=True)


def cell_text(r: dict | None, best: bool) -> str:
    if r is None or r.get("overall") is None:
        return "-"
    text = f"{r['overall']:.2f}x"
    if r.get("overall_std") is not None:
        text += f" ± {r['overall_std']:.2f}"
    text = f"**{text}**" if best else text
    if r.get("timing_flags"):
        text += timing_marks.MARK
    return f"{text} ({r['mat']:.2f}, n={r['n']})" if r.get("mat") is not None else text


def task_table(rows: list[dict], top: int = 6) -> str:
    """The Markdown table of aggregated rows (tables.aggregate): a row per leading method, a column per
    (temperature, task); each cell 'speedup ± std (MAT, n=runs)', the column's best in bold."""
    by_label = cells(rows)
    cols = columns([r for r in rows if r["method"] != "ar"])
    chosen = leaders(by_label, cols, top)
    best = {}
    for col in cols:
        ran = [(by_label[lab][col]["overall"], lab) for lab in by_label
               if col in by_label[lab] and by_label[lab][col].get("overall") is not None]
        best[col] = max(ran)[1] if ran else None
    header = ["method", *[f"{task} T={t:g}" for t, task in cols]]
    body = [[lab, *[cell_text(by_label[lab].get(col), best[col] == lab) for col in cols]] for lab in chosen]
    return markdown_table(header, body)

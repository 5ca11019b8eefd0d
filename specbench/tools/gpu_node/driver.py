"""The node's command: `stage` gathers a call's carried parts; `run` runs every stage in order, each in
a process of its own (`_stage NAME`, through the entry script) under its budget, then archives what the
stages wrote and leaves summary.md, stages.json, results.tar.gz and log.txt under --out."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tarfile
import time
import traceback
from pathlib import Path

from specbench.tools.gpu_node import compile_cache, limits, node
from specbench.tools.gpu_node.jobs import last_line, run_stage_process
from specbench.tools.gpu_node.limits import STAGES, check_output_folder, stage_budget
from specbench.tools.gpu_node.real_model import LEADING_METHODS, MAX_NEW_TOKENS
from specbench.tools.gpu_node.stages import FAIL, PARTIAL, STAGE_FUNCTIONS, stage_env
from specbench.tools.gpu_node.summary import summary_markdown

ENTRY = node.ROOT / "scripts" / "gpu_check.py"  # what each stage's process runs (`_stage NAME`)


def run_one_stage(name: str, args, runner=None) -> int:
    """The body of `_stage NAME`: one stage in this process, its result written as JSON. Told to stop
    (SIGTERM, its budget ended), it leaves where every thread was in work/NAME.at_budget.traceback."""
    import faulthandler

    import torch

    work = Path(args.work)
    where = open(work / f"{name}.at_budget.traceback", "w")
    faulthandler.register(signal.SIGTERM, file=where, all_threads=True, chain=True)
    ctx = {"work": work, "cuda": torch.cuda.is_available() and not args.cpu, "deadline": args.deadline,
           "manifest": node.read_manifest(), "env": stage_env(args.cpu), "max_new_tokens": args.max_new_tokens,
           "log": work / f"{name}.log", "methods": args.methods.split(",") if args.methods else None,
           "runner": runner, "rounds": args.rounds}
    try:
        result = STAGE_FUNCTIONS[name](ctx)
    except Exception as e:  # noqa: BLE001 - a stage's failure is its result; the next stage runs anyway
        result = {"status": FAIL, "detail": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        (work / f"{name}.traceback").write_text(traceback.format_exc())
    (work / "stages").mkdir(exist_ok=True)
    (work / "stages" / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    faulthandler.unregister(signal.SIGTERM)
    where.close()
    Path(where.name).unlink()  # it ended on its own
    return 0


def stage_result(work: Path, name: str, timed_out: bool) -> dict:
    """What a stage's process left: its result, else what it finished before its budget ended it and
    the last line of its log (what it was doing: the test, the method, the compile)."""
    result_file = work / "stages" / f"{name}.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    log = work / f"{name}.log"
    last = last_line(log.read_text(errors="replace")) if log.is_file() else None
    ended = "ran past its budget" if timed_out else "ended without a result"
    rows_file = work / f"{name}.json"  # methods finished so far (run_methods writes it after each)
    if rows_file.is_file():
        rows = json.loads(rows_file.read_text())
        done = [r["method"] for r in rows if r["status"] == "ok"]
        return {"status": PARTIAL if timed_out and done else FAIL, "rows": rows,
                "detail": f"{len(done)} methods done ({', '.join(done)}); {ended} at: {last or 'no output'}"}
    return {"status": PARTIAL if timed_out else FAIL, "detail": f"{ended} at: {last or 'no output'}"}


def archive(work: Path, target: Path) -> None:
    """Everything the stages wrote, in one archive (what comes back is at most 8 files)."""
    with tarfile.open(target, "w:gz") as tar:
        tar.add(work, arcname="gpu_check")
    if target.stat().st_size > limits.OUT_FILE_BYTES:  # drop the bulkiest (per-step answers) before figures
        with tarfile.open(target, "w:gz") as tar:
            tar.add(work, arcname="gpu_check", filter=lambda t: None if t.name.endswith("answers.jsonl") else t)


def stage_command(name: str, work: Path, deadline: float, args) -> list[str]:
    cmd = [sys.executable, "-u", str(ENTRY), "_stage", name, "--work", str(work), "--deadline", str(deadline),
           "--max-new-tokens", str(args.max_new_tokens), "--rounds", str(args.rounds)]
    return cmd + (["--cpu"] if args.cpu else []) + (["--methods", args.methods] if args.methods else [])


def run_stages(args, work: Path, skip: set[str], start: float, say) -> dict:
    """Each stage not skipped, in order, under the budget stage_budget gives it."""
    env, results = stage_env(args.cpu), {}
    for i, st in enumerate(STAGES):
        if st.name in skip:
            results[st.name] = {"status": "SKIP(asked)", "detail": "--skip", "seconds": 0}
            continue
        left = args.budget - (time.time() - start) - limits.ARCHIVE_SECONDS
        budget = stage_budget(STAGES, i, left, args.cpu, skip)
        if budget < 5:
            results[st.name] = {"status": "SKIP(time)", "detail": "no time left", "seconds": 0}
            say(f"== {st.name}: SKIP(time)")
            continue
        own = st.cpu_budget if args.cpu else st.gpu_budget
        say(f"== {st.name} ({st.what}; budget {budget:.0f} s" + (f", its own {own} s" if round(budget) != own else "")
            + ")")
        t0 = time.time()
        deadline = t0 + budget - limits.GRACE_SECONDS - 2
        timed_out = run_stage_process(stage_command(st.name, work, deadline, args), work / f"{st.name}.log", budget, env)
        res = stage_result(work, st.name, timed_out)
        res["seconds"], res["budget"] = round(time.time() - t0, 1), round(budget)
        results[st.name] = res
        say(f"   {res['status']} in {res['seconds']:.0f} s: {res['detail']}")
    return results


def run_all(args) -> int:
    start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = node.stage_carried()
    work = node.node_paths()["work"]
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log = open(out / "log.txt", "w")

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    present, missing = node.parts_status(manifest)
    say(f"gpu_check: {'CPU rehearsal' if args.cpu else 'GPU'} run, {args.budget} s in all; weight parts here: "
        f"{len(present)}/{len(present) + len(missing)}")
    say(compile_cache.restore(node.node_paths()["compile_cache"], compile_cache.cache_dir()))
    results = run_stages(args, work, limits.skipped_stages(args.skip), start, say)
    (work / "stages.json").write_text(json.dumps(results, indent=1, default=str))
    summary = summary_markdown(results, work, args.cpu)
    (work / "summary.md").write_text(summary)
    archive(work, out / "results.tar.gz")
    shutil.copyfile(work / "summary.md", out / "summary.md")
    shutil.copyfile(work / "stages.json", out / "stages.json")
    say(compile_cache.save(compile_cache.cache_dir(), out))  # for the next slot (docs/gpu.md)
    say(f"gpu_check: done in {time.time() - start:.0f} s; {out}: " + ", ".join(sorted(f.name for f in out.iterdir())))
    log.close()
    print(summary)  # the table last: the call's output tail is what comes back first
    problems = check_output_folder(out)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    return 1 if problems else 0


def parser(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("stage", help="gather this call's carried parts on the node; nothing else")
    run = sub.add_parser("run", help="every stage, then the archive and summary under --out")
    one = sub.add_parser("_stage", help=argparse.SUPPRESS)
    one.add_argument("name", choices=list(STAGE_FUNCTIONS))
    one.add_argument("--work", required=True)
    one.add_argument("--deadline", type=float, required=True)
    for p in (run, one):
        p.add_argument("--cpu", action="store_true", help="the rehearsal: CPU stand-ins, CUDA-only parts SKIP(cuda)")
        p.add_argument("--max-new-tokens", type=int, default=None,
                       help=f"per turn in the real-model stages (default: {MAX_NEW_TOKENS['gpu']} on a GPU, "
                            f"{MAX_NEW_TOKENS['cpu']} on the CPU)")
        p.add_argument("--rounds", type=int, default=3,
                       help="rounds of every method in the compiled real-model stage (each method once before any twice)")
        p.add_argument("--methods", default="", help=f"comma list for the real-model stages (default: "
                       f"{','.join(LEADING_METHODS)}; all: every registered method)")
    run.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    run.add_argument("--budget", type=int, default=None,
                     help=f"seconds for every stage together (default {limits.TOTAL_BUDGET}; --cpu: {limits.CPU_BUDGET})")
    run.add_argument("--skip", default="", help="comma list of stages not to run: " + ",".join(s.name for s in STAGES))
    return ap


def main(argv=None, doc: str = __doc__, runner=None) -> int:
    """The command line; `runner`: what the real-model stages run a method with (scripts/gpu_check.py's)."""
    ap = parser(doc)
    args = ap.parse_args(argv)
    if args.command == "stage":
        present, missing = node.parts_status(node.stage_carried())
        print(f"gpu_check stage: {len(present)} of {len(present) + len(missing)} weight parts on this machine "
              f"({node.NODE_DIR}); missing: {', '.join(missing) or 'none'}")
        return 0
    if args.max_new_tokens is None:
        args.max_new_tokens = MAX_NEW_TOKENS["cpu" if args.cpu else "gpu"]
    if args.command == "_stage":
        return run_one_stage(args.name, args, runner)
    if args.budget is None:
        args.budget = limits.CPU_BUDGET if args.cpu else limits.TOTAL_BUDGET
    try:
        limits.skipped_stages(args.skip)
    except ValueError as e:
        ap.error(str(e))
    return run_all(args)

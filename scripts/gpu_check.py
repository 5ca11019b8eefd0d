"""The prepared command for a GPU node without network: stages with their own time budgets, each
stage's failure logged and the next stage run anyway, everything packed into one archive and a short
summary under the output folder, a table printed last (docs/gpu.md).

    python scripts/gpu_pack.py                       # here: wheels, questions, weights in parts; the call plan
    python3 scripts/gpu_check.py stage               # on the node, a call that only brings weight parts
    python3 scripts/gpu_check.py run --out "$OUT"    # on the node, the last call: every stage
    python3 scripts/gpu_check.py run --out DIR --cpu # the rehearsal: CPU stand-ins, small shapes

What a call carries (`.gpu/callN/`, made by gpu_pack.py) is gathered into the node's own folder
(SPECBENCH_NODE_DIR, default /tmp/specbench-node), which outlives a call while the machine stays
warm. The node needs nothing but its own Python with torch and transformers: hydra, omegaconf and gguf
come as wheels, installed into a private folder; the network is never asked for.

Stages, in this order: probe (GPU, versions, carried wheels), weights (the embedded model's GGUF
assembled and checked by sha256), then by value: real_model_compiled (every method on the embedded
model in float16 on CUDA graphs, AR interleaved, every token checked, after a warm-up), real_model
(the leading methods eager), cuda_tests (the CUDA-only tests, eager first), real_model_bf16,
cost_curves (random weights at SmolLM2-135M, Vicuna-7B and Vicuna-13B shapes, eager, compiled when
time is left, with predicted speedups) and step_profile (where a step's time goes, with what is left). Each
stage is sure of its own budget, and the budgets add up within the call; a stage may also use what
earlier stages left unused beyond what the later ones are sure of. Each
stage's process, and everything it starts, writes straight into its log unbuffered, so a stage its
budget ends leaves its progress, and its detail names the last line (the test that was running). On
the CPU (--cpu) the CUDA-only parts are SKIP(cuda) and the shapes are small stand-ins.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRIED = ROOT / ".gpu"
NODE_DIR = Path(os.environ.get("SPECBENCH_NODE_DIR", "/tmp/specbench-node"))
TOTAL_BUDGET = 540  # seconds: a call may run 600, and a margin needs the rest
CPU_BUDGET = 900  # the rehearsal: no device clock, but CI's time; the CPU runs the same stages slower
ARCHIVE_SECONDS = 15  # held back from the stages for the archive and the summary
MARGIN_SECONDS = 30  # also left out of the stages' sum: the driver's start, process starts
GRACE_SECONDS = 3  # a stage past its budget is told to stop (SIGTERM) this long before it is killed
# What comes back from the node: at most 8 files of at most 16 MiB, at most two folders down
OUT_FILES, OUT_FILE_BYTES = 8, 16 << 20
# Methods in the order their figures matter most, should a stage's time run out
PRIORITY = ["tr_fused", "tr", "tr_adaptive", "pld", "suffix", "eagle", "samd", "lookahead", "rest", "medusa", "sps"]
# The real-model stages' methods unless --methods says otherwise (`--methods all`: every registered one)
LEADING_METHODS = ["tr_fused", "tr", "tr_adaptive", "pld", "suffix"]
SHAPES = {"gpu": ["smollm2-135m", "vicuna-7b", "vicuna-13b"], "cpu": ["tiny-135m", "tiny-7b", "tiny-13b"]}
# New tokens per turn in the real-model stages: 32 on the GPU (every method within real_model's budget,
# docs/gpu.md), 16 on the CPU
MAX_NEW_TOKENS = {"gpu": 32, "cpu": 16}
# A cost curve is not started with less than this left (seconds): eager, compiled (inductor, minutes cold)
CURVE_MIN_SECONDS = {"eager": 10, "compiled": 40}
PASS, FAIL, PARTIAL, SKIP_CUDA = "PASS", "FAIL", "PARTIAL", "SKIP(cuda)"


@dataclass
class Stage:
    name: str
    gpu_budget: int  # seconds the stage is sure of (it may also get what earlier stages left unused)
    cpu_budget: int
    what: str


# Run in this order: probe and weights, then the most valuable first. The GPU budgets add up to
# TOTAL_BUDGET less ARCHIVE_SECONDS and MARGIN_SECONDS (tests/test_gpu_check.py; docs/gpu.md's table).
# Every method has run eager on a GPU, and the leading five compiled, where compiled beat eager
# (results/gpu/: an H200), so `compile=auto` compiles on CUDA. What is still open comes first: every
# method on the compiled forward, then the leading ones eager beside it in the same session, the CUDA
# tests, bfloat16, more cost curves, and the step profile with whatever time is left.
STAGES = [
    Stage("probe", 25, 60, "GPU, versions, carried wheels installed privately"),
    Stage("weights", 15, 30, "the embedded model's GGUF from its parts, sha256 checked"),
    Stage("real_model_compiled", 210, 30, "every method on the embedded model in float16 on the compiled forward "
                                          "(CUDA graphs), AR interleaved, every token checked, after a warm-up"),
    Stage("real_model", 140, 300, "the leading methods on the embedded model (float16 on a GPU), eager, AR "
                                  "interleaved, every token checked, after a throwaway warm-up"),
    Stage("cuda_tests", 60, 60, "CUDA tests, eager first, then the compiled (CUDA graphs) ones: float16 and "
                                "bfloat16, syncs, matrix update"),
    Stage("real_model_bf16", 25, 200, "the leading methods in bfloat16, eager"),
    Stage("cost_curves", 20, 90, "t(w) at real shapes with random weights (eager; compiled if time is left), "
                                 "predicted speedups"),
    Stage("step_profile", 0, 100, "with the time left: PLD's steps by rows verified, garbage collector on and "
                                  "off, one host thread; a turn under torch's profiler"),
]


def stage_budget(stages: list[Stage], i: int, left: float, cpu: bool, skip: set[str] = frozenset()) -> float:
    """Stage i's budget: its own, and what earlier stages left unused beyond what the stages after it
    are sure of; never more than is left."""
    own = (lambda st: st.cpu_budget) if cpu else (lambda st: st.gpu_budget)
    later = sum(own(st) for st in stages[i + 1:] if st.name not in skip)
    return max(0.0, min(left, max(own(stages[i]), left - later)))


# -- paths on the node ------------------------------------------------------------------------------

def node_paths(node: Path | None = None) -> dict:
    node = node or NODE_DIR
    return {"node": node, "wheels": node / "wheels", "parts": node / "parts", "questions": node / "questions",
            "site": node / "site", "cache": node / "cache", "work": node / "work",
            "manifest": node / "manifest.json"}


def stage_carried(carried: Path = CARRIED, node: Path | None = None) -> dict:
    """Gather what this call carried (.gpu/call*/) into the node's folder; returns the manifest (or {})."""
    p = node_paths(node)
    for folder in sorted(carried.glob("call*")):
        for sub in ("wheels", "parts", "questions"):
            for f in sorted((folder / sub).glob("*")):
                p[sub].mkdir(parents=True, exist_ok=True)
                if not (p[sub] / f.name).is_file() or (p[sub] / f.name).stat().st_size != f.stat().st_size:
                    shutil.copyfile(f, p[sub] / f.name)
        if (folder / "manifest.json").is_file():
            p["node"].mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / "manifest.json", p["manifest"])
    return json.loads(p["manifest"].read_text()) if p["manifest"].is_file() else {}


def parts_status(manifest: dict, node: Path | None = None) -> tuple[list[str], list[str]]:
    """(present, missing) weight parts on the node, by the manifest."""
    parts = node_paths(node)["parts"]
    names = [part["name"] for part in manifest.get("weights", {}).get("parts", [])]
    present = [n for n in names if (parts / n).is_file()]
    return present, [n for n in names if n not in present]


# -- stages (each runs in a process of its own, under its budget) -----------------------------------

def _sha256(path: Path) -> str:
    # specbench.inputs.models.file_sha256's twin: the weights are assembled on the node before the
    # checkout is importable there
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stage_probe(ctx: dict) -> dict:
    """The machine and its libraries; the carried wheels installed into a private folder."""
    import platform

    p = node_paths()
    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "cpus_usable": len(os.sched_getaffinity(0)), "cgroup_cpu_max": cgroup_cpu().get("cpu_max")}
    wheels = sorted(p["wheels"].glob("*.whl"))
    if wheels:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--no-cache-dir", "--upgrade", "--target", str(p["site"]), *map(str, wheels)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return {"status": FAIL, "detail": "installing the carried wheels failed: " + done.stderr.strip()[-300:]}
    env["wheels"] = [w.name for w in wheels]
    probe = ("import json, torch, transformers, importlib.metadata as m\n"
             "out = {'torch': torch.__version__, 'cuda': torch.version.cuda, 'transformers': transformers.__version__,\n"
             "       'cuda_available': torch.cuda.is_available(), 'torch_threads': torch.get_num_threads()}\n"
             "for name in ('accelerate', 'safetensors', 'tokenizers', 'numpy', 'hydra-core', 'omegaconf', 'gguf'):\n"
             "    try: out[name] = m.version(name)\n"
             "    except m.PackageNotFoundError: out[name] = None\n"
             "if torch.cuda.is_available():\n"
             "    pr = torch.cuda.get_device_properties(0)\n"
             "    out.update(gpu=pr.name, gpu_memory_gib=round(pr.total_memory / 2**30, 1),\n"
             "               capability='.'.join(map(str, torch.cuda.get_device_capability(0))), sms=pr.multi_processor_count)\n"
             "import hydra, omegaconf, gguf\n"
             "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=ctx["env"])
    if done.returncode != 0:
        return {"status": FAIL, "detail": "probe: " + (done.stderr.strip().splitlines() or ["?"])[-1], "env": env}
    env.update(json.loads(done.stdout.strip().splitlines()[-1]))
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm,"
                              "pstate,persistence_mode,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True)
        env["nvidia_smi"] = smi.stdout.strip()
    from specbench.environment import check_environment

    check_environment()  # the node's torch and transformers are inside the declared floor
    (ctx["work"] / "env.json").write_text(json.dumps(env, indent=1))
    gpu = env.get("gpu") or "no GPU"
    return {"status": PASS, "detail": f"{gpu}; torch {env['torch']} (CUDA {env['cuda']}), transformers "
                                      f"{env['transformers']}; {len(wheels)} wheels", "env": env}


def embedded_gguf_path(manifest: dict) -> Path:
    """Where the model loader looks for the embedded model's assembled GGUF (no pip needed then)."""
    w = manifest["weights"]
    return node_paths()["cache"] / "gguf" / w["model"] / w["file"]


def stage_weights(ctx: dict) -> dict:
    manifest = ctx["manifest"]
    if not manifest.get("weights"):
        return {"status": FAIL, "detail": "no manifest: run scripts/gpu_pack.py here and carry .gpu/call* along"}
    w = manifest["weights"]
    target = embedded_gguf_path(manifest)
    if target.is_file() and _sha256(target) == w["sha256"]:
        return {"status": PASS, "detail": f"{w['file']} already assembled, sha256 {w['sha256'][:12]}"}
    present, missing = parts_status(manifest)
    if missing:
        return {"status": FAIL, "detail": f"parts {', '.join(missing)} never reached this machine (a staging call "
                                          f"ran on another machine, or this one went cold between calls): rerun them"}
    parts = node_paths()["parts"]
    for part in w["parts"]:
        if _sha256(parts / part["name"]) != part["sha256"]:
            return {"status": FAIL, "detail": f"part {part['name']} does not match its sha256"}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with tmp.open("wb") as out:
        for part in w["parts"]:
            with (parts / part["name"]).open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    if _sha256(tmp) != w["sha256"]:
        tmp.unlink()
        return {"status": FAIL, "detail": f"the assembled {w['file']} does not match its sha256"}
    tmp.replace(target)
    return {"status": PASS, "detail": f"{w['file']} from {len(w['parts'])} parts, {w['size'] / 2**20:.1f} MiB, "
                                      f"sha256 {w['sha256'][:12]}"}


# The cheap eager tests first, the compile-heavy ones (inductor, tens of seconds each on a fresh node)
# last, in a pytest session of their own: the eager session's failures are printed in full before any
# compile starts, so a budget cut still leaves them, and the log names the test that was running
EAGER_CUDA_TESTS = ["tests/test_cuda.py::test_tr_matrix_update_is_deterministic_on_cuda",
                    "tests/test_engine_device.py::test_tr_on_cuda_equals_ar_on_cuda",
                    "tests/test_gpu_readiness.py::test_on_cuda_a_step_synchronises_within_its_budget"]
COMPILED_CUDA_TESTS = ["tests/test_cuda.py::test_a_compiled_step_synchronises_once",  # one compile (float16)
                       "tests/test_cuda.py::test_compiled_tr_equals_eager_ar",  # three: float32, float16, bfloat16
                       "tests/test_cuda.py::test_compiled_ar_equals_eager_ar_on_a_sliding_window_model"]
CUDA_TESTS = EAGER_CUDA_TESTS + COMPILED_CUDA_TESTS


def pytest_command(tests: list[str], junit: Path) -> list[str]:
    """pytest unbuffered and verbose: each test's node id is in the log as it starts, its outcome as it ends."""
    return [sys.executable, "-u", "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider", "-n", "0",
            "--junitxml", str(junit), *tests]


def pytest_counts(text: str) -> dict:
    """passed/failed/skipped/errors from pytest's closing line."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "error")}
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", text):
        counts[word.rstrip("s") if word.startswith("error") else word] += int(n)
    return counts


def verbose_counts(text: str) -> dict:
    """passed/failed/skipped/errors from pytest -v's line per test, for a run that never reached its end."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "error")}
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


def stage_cuda_tests(ctx: dict) -> dict:
    before = len(log_text(ctx))
    print(f"gpu_check: cuda_tests: {len(CUDA_TESTS)} selections, the eager ones first", flush=True)
    c = {k: 0 for k in ("passed", "failed", "skipped", "error")}
    for part, tests in (("eager", EAGER_CUDA_TESTS), ("compiled", COMPILED_CUDA_TESTS)):
        start = len(log_text(ctx))
        rc = run_job(pytest_command(tests, ctx["work"] / f"cuda_tests_{part}.xml"), ctx["deadline"] - time.time(),
                     env=ctx["env"], cwd=ROOT)
        out = log_text(ctx)[start:]
        closing = closing_line(out)
        for k, v in (pytest_counts(closing) if closing else verbose_counts(out)).items():
            c[k] += v
        if rc is None or (rc not in (0, 1, 5) and not closing):
            break
    out = log_text(ctx)[before:]
    detail = f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, {c['error']} errors"
    if rc is None:
        detail += f"; ran out of its budget at: {last_line(out) or 'no output'}"
        return {"status": FAIL if c["failed"] or c["error"] else PARTIAL, "detail": detail, "counts": c}
    if c["failed"] or c["error"] or rc not in (0, 1, 5):
        if rc not in (0, 1, 5):
            detail += f"; pytest exited {rc}: {last_line(out) or 'no output'}"
        return {"status": FAIL, "detail": detail, "counts": c}
    if not ctx["cuda"]:
        return {"status": SKIP_CUDA if not c["passed"] else PASS, "detail": detail + " (no GPU here)", "counts": c}
    return {"status": PASS if c["passed"] else FAIL, "detail": detail, "counts": c}


def stage_cost_curves(ctx: dict) -> dict:
    """scripts/shape_cost.py per shape and forward, each in its own process (a 13B model's memory is
    returned when it ends), the eager curves first, the compiled ones only while time is left; the
    curves and prediction tables go to work/cost/, each job's output into the stage's log."""
    out = ctx["work"] / "cost"
    out.mkdir(exist_ok=True)
    kind = "gpu" if ctx["cuda"] else "cpu"
    forwards = ["eager", "compiled"] if ctx["cuda"] else ["eager"]
    jobs = [(s, f) for f in forwards for s in SHAPES[kind]]
    results, failed = [], []
    for i, (shape, forward) in enumerate(jobs):
        left = ctx["deadline"] - time.time()
        if left < CURVE_MIN_SECONDS[forward]:
            failed.append(f"{shape}/{forward}: no time left")
            continue
        cmd = [sys.executable, "-u", "scripts/shape_cost.py", "--shape", shape, "--out", str(out),
               "--device", "cuda" if ctx["cuda"] else "cpu", "--dtype", "float16" if ctx["cuda"] else "float32"]
        if not ctx["cuda"]:  # the stand-ins: the command's path, not figures
            cmd += ["--widths", "1,4,16,81", "--repeats", "2"]
        if forward == "compiled":
            cmd.append("--compile")
            timeout = left  # only what the eager curves left
        else:  # an eager curve that hangs leaves the next ones their share
            timeout = max(CURVE_MIN_SECONDS[forward], left / sum(f == "eager" for _, f in jobs[i:]) * 1.5)
        print(f"gpu_check: cost_curves: {shape}/{forward} ({i + 1} of {len(jobs)}, {left:.0f} s left)", flush=True)
        before = len(log_text(ctx))
        rc = run_job(cmd, min(timeout, left), env=ctx["env"], cwd=ROOT)
        if rc is None:
            failed.append(f"{shape}/{forward}: timed out at: {last_line(log_text(ctx)[before:]) or 'no output'}")
        elif rc != 0:
            failed.append(f"{shape}/{forward}: " + (last_line(log_text(ctx)[before:]) or f"exit {rc}"))
        else:
            results.append(f"{shape}/{forward}")
    missing_compiled = [f for f in failed if "/compiled" in f]
    status = PASS if not failed else (PARTIAL if results else FAIL)
    detail = f"{len(results)}/{len(jobs)} curves" + (f"; {'; '.join(failed)}" if failed else "")
    if not ctx["cuda"]:
        detail += "; compiled (CUDA graphs): SKIP(cuda)"
    return {"status": status, "detail": detail, "curves": results, "failed": failed,
            "compiled_fell_back": missing_compiled}


def method_order(available: list[str], wanted: list[str] | None = None) -> list[str]:
    """The methods to run, most valuable first (AR runs beside each, interleaved)."""
    pool = [m for m in available if m != "ar" and (wanted is None or m in wanted)]
    return [m for m in PRIORITY if m in pool] + sorted(m for m in pool if m not in PRIORITY)


# The throwaway warm-up: AR on one question (and the runner's own warm-up, this many times over).
# Spec-Bench's first summarization question has the longest prompt of the six (769 tokens), so the
# compiled forward's cache capacity, and its graphs, made in the warm-up serve every method after it.
WARMUP_SUBTASK, WARMUP_REPEATS = "summarization", 2


def real_model_overrides(ctx: dict, dtype: str, forward: str, root: Path, warm_up: bool = False) -> list[str]:
    """The runner's settings for a real-model stage; `warm_up`: the throwaway AR run on one question."""
    cpu = not ctx["cuda"]
    questions = node_paths()["questions"] / "question.jsonl"
    over = ["model=smollm2-135m", f"device={'cpu' if cpu else 'cuda'}", f"dtype={dtype}",
            f"compile={'on' if forward == 'compiled' else 'off'}", "baseline=interleave",
            f"warmup={WARMUP_REPEATS if warm_up else 1}", f"max_new_tokens={ctx['max_new_tokens']}",
            f"results_root={root}", "wandb.enabled=false", "progress=false", f"cost_curve={'off' if cpu else 'auto'}"]
    if questions.is_file():
        over += ["task=spec_bench", f"task.path={questions}", "task.per_subtask=1"]
        if warm_up:
            over += [f"task.subtasks=[{WARMUP_SUBTASK}]"]
        elif cpu:
            over += ["task.subtasks=[translation,math_reasoning]"]
    else:  # the rehearsal without Spec-Bench's file: the built-in questions
        over += ["task=mini", "task.limit=1" if warm_up else "task.limit=2" if cpu else "task.limit=12"]
    return over


def answer_records(path: Path) -> list[dict]:
    """A run's answers.jsonl or baseline_answers.jsonl, a torn line (a run killed by its budget) left
    out; [] when there is none."""
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def median_step_ms(path: Path) -> float | None:
    """The median of every decoding step's time, in ms, over a run's answers (each turn's
    step_times)."""
    import statistics

    times = [t for r in answer_records(path) for turn in r.get("turns", []) for t in turn.get("step_times") or []]
    return round(statistics.median(times) * 1e3, 2) if times else None


def step_medians(summary: dict) -> dict:
    """Median method step and median AR step (ms) of a finished run: an AR disturbed by something
    outside the run shows as an AR step unlike the other methods' AR steps."""
    d = Path(summary.get("results_dir") or "/nonexistent")
    return {"step_ms": median_step_ms(d / "answers.jsonl"), "ar_step_ms": median_step_ms(d / "baseline_answers.jsonl")}


def cgroup_cpu() -> dict:
    """The container's CPU quota and throttling so far (cgroup v2, else v1; {} where neither is readable):
    a launch-bound decode on a node whose quota is below its visible cores is throttled in bursts."""
    out = {}
    for v2, v1, key in (("/sys/fs/cgroup/cpu.max", None, "cpu_max"),
                        ("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/cpu/cpu.stat", "cpu_stat")):
        for path in (v2, v1):
            if path and Path(path).is_file():
                out[key] = Path(path).read_text().strip()
                break
    if "cpu_max" not in out and Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").is_file():
        out["cpu_max"] = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text().strip() + " "
                          + Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text().strip())
    if "cpu_stat" in out:  # "nr_throttled 3\nthrottled_usec 12" (v2) or "throttled_time" in ns (v1)
        stat = dict(line.split() for line in out["cpu_stat"].splitlines() if len(line.split()) == 2)
        out["nr_throttled"] = int(stat.get("nr_throttled", 0))
        out["throttled_ms"] = (int(stat["throttled_usec"]) / 1e3 if "throttled_usec" in stat
                               else int(stat.get("throttled_time", 0)) / 1e6)
    return out


class NodeSampler:
    """While a real-model stage runs on a GPU: nvidia-smi's SM clock, power state, use and power every
    250 ms into `<stage>_gpu_samples.csv`, and the container's CPU throttling before and after. Slow
    steps that meet a clock drop, or a throttled CPU, then show in what comes back (issue 49: whole
    turns ran at 60-80 ms a step instead of 20, AR's too)."""

    QUERY = "timestamp,clocks.sm,clocks.mem,pstate,utilization.gpu,power.draw,temperature.gpu"

    def __init__(self, work: Path, name: str):
        self.path, self.proc, self.before = work / f"{name}_gpu_samples.csv", None, cgroup_cpu()
        if shutil.which("nvidia-smi"):
            self.file = self.path.open("w")
            self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={self.QUERY}", "--format=csv,nounits",
                                          "-lms", "250"], stdout=self.file, stderr=subprocess.DEVNULL)

    def stop(self) -> dict:
        """What the samples say: SM clock min / median / max (MHz), power states seen, throttling."""
        import statistics

        out = {}
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=5)
            self.file.close()
            rows = [r.split(", ") for r in self.path.read_text().splitlines()[1:] if r.count(",") >= 6]
            clocks = [float(r[1]) for r in rows if r[1].strip().replace(".", "").isdigit()]
            if clocks:
                out.update(samples=len(rows), sm_mhz_min=min(clocks), sm_mhz_median=statistics.median(clocks),
                           sm_mhz_max=max(clocks), pstates=sorted({r[3].strip() for r in rows}))
        after = cgroup_cpu()
        out["cpu_max"] = after.get("cpu_max")
        if "nr_throttled" in after and "nr_throttled" in self.before:
            out["cpu_throttled_periods"] = after["nr_throttled"] - self.before["nr_throttled"]
            out["cpu_throttled_ms"] = round(after["throttled_ms"] - self.before["throttled_ms"], 1)
        return out


def turn_timeline(summary: dict) -> list[str]:
    """Each turn's median step (ms) in the order the run decoded them, AR's ('a') and the method's ('m')
    interleaved: a slow stretch shows whether it follows the method, AR or the clock."""
    import statistics

    d = Path(summary.get("results_dir") or "/nonexistent")
    first = ((summary.get("order") or {}).get("first") or {})

    def turns(path: Path) -> dict:
        return {str(r["question_id"]): [statistics.median(t["step_times"]) * 1e3 for t in r["turns"] if t.get("step_times")]
                for r in answer_records(path)}

    method, ar = turns(d / "answers.jsonl"), turns(d / "baseline_answers.jsonl")
    line = []
    for q, times in method.items():
        pair = [("m", times), ("a", ar.get(q, []))]
        for who, ts in (pair if first.get(q) == "method" else pair[::-1]):
            line += [f"{who}{t:.0f}" for t in ts]
    return line


def run_methods(ctx: dict, name: str, dtype: str, forward: str, methods: list[str]) -> dict:
    """Each method through the runner in this process (the model loads once), AR interleaved, after a
    throwaway AR run (loading, converting, the rounding band, the cost curve, the GPU's and allocator's
    first use: none of it in the first method's figures); a method that fails is recorded and the next
    one runs; none starts without the time the previous one took."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench.main import main_exit_code, run_benchmark
    from specbench.errors import SpecbenchError

    root = ctx["work"] / "runs" / name
    rows, last, warm = [], 0.0, {"status": "not run"}
    sampler = NodeSampler(ctx["work"], name) if ctx["cuda"] else None
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        start = time.time()
        print(f"gpu_check: {name}: warm-up (AR on one question, not counted)", flush=True)
        try:
            cfg = compose("config", overrides=["method=ar", *real_model_overrides(ctx, dtype, forward,
                                                                                  root / "warmup", warm_up=True)])
            warm = {"status": "ok", **step_medians(run_benchmark(OmegaConf.to_container(cfg, resolve=True)))}
        except BaseException as e:  # noqa: BLE001 - the methods still run (the first one then pays for loading)
            if isinstance(e, KeyboardInterrupt):
                raise
            warm = {"status": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
            (ctx["work"] / f"{name}_warmup.traceback").write_text(traceback.format_exc())
        warm["seconds"] = round(time.time() - start, 1)
        warm["ar_step_ms"] = warm.pop("step_ms", None)
        print(f"  {name}: warm-up {warm['status']} in {warm['seconds']:.0f} s (AR median step "
              f"{warm['ar_step_ms']} ms)", flush=True)
        for m in methods:
            left = ctx["deadline"] - time.time()
            if left < 1.5 * last:
                rows.append({"method": m, "status": "SKIP(time)"})
                continue
            print(f"gpu_check: {name}: {m} ({left:.0f} s left)", flush=True)
            start = time.time()
            row = {"method": m, "forward": forward, "dtype": dtype}
            try:
                cfg = compose("config", overrides=[f"method={m}", *real_model_overrides(ctx, dtype, forward, root)])
                summary = run_benchmark(OmegaConf.to_container(cfg, resolve=True))
                code = main_exit_code(summary, OmegaConf.to_container(cfg, resolve=True))
                row.update(summary_row(summary), **step_medians(summary), turns=turn_timeline(summary),
                           status="ok" if code == 0 else "lossless check failed")
            except SpecbenchError as e:
                row.update(status=f"error: {e}")
            except BaseException as e:  # a CUDA error, a bug, a SystemExit: recorded, the next one runs
                if isinstance(e, KeyboardInterrupt):
                    raise
                row.update(status=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
                (ctx["work"] / f"{name}_{m}.traceback").write_text(traceback.format_exc())
            took = time.time() - start
            # the first method's time is a guide only when the warm-up paid for loading
            last = took if rows or warm["status"] == "ok" else 0.0
            row["seconds"], row["started"] = round(took, 1), round(start, 1)
            rows.append(row)
            print(f"  {name}: {m} {row['status']} in {took:.0f} s (median step {row.get('step_ms')} ms, "
                  f"AR {row.get('ar_step_ms')} ms)", flush=True)
            (ctx["work"] / f"{name}.json").write_text(json.dumps(rows, indent=1))  # kept if the budget ends it
    node = sampler.stop() if sampler else {}
    bad = [r for r in rows if r["status"] not in ("ok", "SKIP(time)")]
    skipped = [r["method"] for r in rows if r["status"] == "SKIP(time)"]
    status = FAIL if bad else (PARTIAL if skipped else PASS)
    detail = f"{sum(r['status'] == 'ok' for r in rows)}/{len(rows)} methods ok ({dtype}, {forward})"
    if bad:
        detail += "; " + "; ".join(f"{r['method']}: {r['status']}" for r in bad)
    if skipped:
        detail += f"; no time for {', '.join(skipped)}"
    if warm["status"] != "ok":
        detail += f"; warm-up: {warm['status']}"
    return {"status": status, "detail": detail, "rows": rows, "warmup": warm, "node": node}


def summary_row(s: dict) -> dict:
    lo, sp = s["lossless"], s.get("speedup") or {}
    from specbench.run.lossless import verdict_line

    return {"speedup": sp.get("overall"), "decode_speedup": (s.get("decode_speedup") or {}).get("overall"),
            "bound": s.get("speedup_bound"), "mat": s["mat"], "rows_per_step": s.get("rows_per_step"),
            "tokens_per_s": s["tokens_per_s"], "ar_tokens_per_s": s.get("baseline_tokens_per_s"),
            "questions": s["questions"], "forward_used": s.get("forward"), "lossless": verdict_line(lo),
            "tokens_checked": lo.get("tokens_checked"), "tokens_outside_band": lo.get("tokens_outside_band"),
            "mismatches": lo.get("mismatches"), "device": s.get("device"),
            # the lossless check's rounding band as measured on this device (rounding_band.py)
            "band_ulps": (s.get("rounding_band") or {}).get("band_ulps"),
            "band_measured_logits": (s.get("rounding_band") or {}).get("measured_logits")}


def needs_weights(ctx: dict) -> dict | None:
    manifest = ctx["manifest"]
    if manifest.get("weights") and embedded_gguf_path(manifest).is_file():
        return None
    return {"status": FAIL, "detail": "the embedded model's weights are not on this machine (stage weights)"}


def stage_methods(ctx: dict, default: list[str] | None = LEADING_METHODS) -> list[str]:
    """--methods, else `default` (None: every registered method), most valuable first."""
    from specbench.registry import available_methods

    wanted = None if ctx["methods"] == ["all"] else (ctx["methods"] or default)
    return method_order(available_methods(), wanted)


def stage_real_model(ctx: dict) -> dict:
    return needs_weights(ctx) or run_methods(ctx, "real_model", "float16" if ctx["cuda"] else "float32", "eager",
                                             stage_methods(ctx))


def stage_real_model_compiled(ctx: dict) -> dict:
    if not ctx["cuda"]:
        return {"status": SKIP_CUDA, "detail": "CUDA graphs need a GPU (the CPU's compiled forward is tested in CI)"}
    return needs_weights(ctx) or run_methods(ctx, "real_model_compiled", "float16", "compiled",
                                             stage_methods(ctx, default=None))


def stage_real_model_bf16(ctx: dict) -> dict:
    return needs_weights(ctx) or run_methods(ctx, "real_model_bf16", "bfloat16", "eager", stage_methods(ctx))


def stage_step_profile(ctx: dict) -> dict:
    """scripts/profile_steps.py in a process of its own: PLD's step times by rows verified, with the
    garbage collector on and off and one host thread, and a turn of PLD and of AR under torch's profiler
    (work/step_profile/)."""
    missing = needs_weights(ctx)
    if missing:
        return missing
    out = ctx["work"] / "step_profile"
    cmd = [sys.executable, "-u", "scripts/profile_steps.py", "--method", "pld", "--out", str(out),
           "--device", "cuda" if ctx["cuda"] else "cpu", "--dtype", "float16" if ctx["cuda"] else "float32"]
    if not ctx["cuda"]:  # the rehearsal: the command's path, not figures
        cmd += ["--prompts", "1", "--max-new-tokens", "12"]
    before = len(log_text(ctx))
    rc = run_job(cmd, ctx["deadline"] - time.time(), env=ctx["env"], cwd=ROOT)
    report = out / "step_profile.json"
    if rc is None or rc != 0 or not report.is_file():
        ended = "ran out of its budget" if rc is None else f"exited {rc}"
        return {"status": FAIL, "detail": f"{ended} at: {last_line(log_text(ctx)[before:]) or 'no output'}"}
    variants = json.loads(report.read_text())["variants"]
    detail = "; ".join(f"{name}: wider steps {v['several_rows'].get('median_ms', '-')} ms "
                       f"({v['several_rows'].get('slow', 0)}/{v['several_rows']['steps']} slow), one-row "
                       f"{v['one_row'].get('median_ms', '-')} ms" for name, v in variants.items())
    return {"status": PASS, "detail": detail}


STAGE_FUNCTIONS = {"probe": stage_probe, "weights": stage_weights,
                   "real_model_compiled": stage_real_model_compiled, "real_model": stage_real_model,
                   "cuda_tests": stage_cuda_tests, "real_model_bf16": stage_real_model_bf16,
                   "cost_curves": stage_cost_curves, "step_profile": stage_step_profile}


def stage_env(cpu: bool) -> dict:
    """The environment of every stage's process: the private site first, the cache on the node, offline."""
    p = node_paths()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(p["site"]), str(ROOT), env.get("PYTHONPATH")]))
    env.update(SPECBENCH_CACHE=str(p["cache"]), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               WANDB_MODE="disabled", PYTHONUNBUFFERED="1", TORCH_EXTENSIONS_DIR=str(p["cache"] / "torch_extensions"),
               PIP_NO_INDEX="1")
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_one_stage(name: str, args) -> int:
    """The body of `_stage NAME`: one stage in this process, its result written as JSON. Told to stop
    (SIGTERM, its budget ended), it leaves where every thread was in work/NAME.at_budget.traceback."""
    import faulthandler

    import torch

    work = Path(args.work)
    where = open(work / f"{name}.at_budget.traceback", "w")
    faulthandler.register(signal.SIGTERM, file=where, all_threads=True, chain=True)
    ctx = {"work": work, "cuda": torch.cuda.is_available() and not args.cpu, "deadline": args.deadline,
           "manifest": json.loads(node_paths()["manifest"].read_text()) if node_paths()["manifest"].is_file() else {},
           "env": stage_env(args.cpu), "max_new_tokens": args.max_new_tokens, "log": work / f"{name}.log",
           "methods": args.methods.split(",") if args.methods else None}
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


# -- the driver --------------------------------------------------------------------------------------

def run_all(args) -> int:
    start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = stage_carried()
    p = node_paths()
    work = p["work"]
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cpu = args.cpu
    env = stage_env(cpu)
    total = args.budget
    skip = set(filter(None, args.skip.split(",")))
    log = open(out / "log.txt", "w")

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    present, missing = parts_status(manifest)
    say(f"gpu_check: {'CPU rehearsal' if cpu else 'GPU'} run, {total} s in all; weight parts here: "
        f"{len(present)}/{len(present) + len(missing)}")
    results = {}
    for i, st in enumerate(STAGES):
        if st.name in skip:
            results[st.name] = {"status": "SKIP(asked)", "detail": "--skip", "seconds": 0}
            continue
        left = total - (time.time() - start) - ARCHIVE_SECONDS
        budget = stage_budget(STAGES, i, left, cpu, skip)
        if budget < 5:
            results[st.name] = {"status": "SKIP(time)", "detail": "no time left", "seconds": 0}
            say(f"== {st.name}: SKIP(time)")
            continue
        own = st.cpu_budget if cpu else st.gpu_budget
        say(f"== {st.name} ({st.what}; budget {budget:.0f} s" + (f", its own {own} s" if round(budget) != own else "")
            + ")")
        t0 = time.time()
        cmd = [sys.executable, "-u", str(Path(__file__).resolve()), "_stage", st.name, "--work", str(work),
               "--deadline", str(t0 + budget - GRACE_SECONDS - 2), "--max-new-tokens", str(args.max_new_tokens)]
        cmd += ["--cpu"] if cpu else []
        cmd += ["--methods", args.methods] if args.methods else []
        timed_out = run_stage_process(cmd, work / f"{st.name}.log", budget, env)
        res = stage_result(work, st.name, timed_out)
        res["seconds"] = round(time.time() - t0, 1)
        res["budget"] = round(budget)
        results[st.name] = res
        say(f"   {res['status']} in {res['seconds']:.0f} s: {res['detail']}")
    (work / "stages.json").write_text(json.dumps(results, indent=1, default=str))
    summary = summary_markdown(results, work, cpu)
    (work / "summary.md").write_text(summary)
    archive(work, out / "results.tar.gz")
    shutil.copyfile(work / "summary.md", out / "summary.md")
    shutil.copyfile(work / "stages.json", out / "stages.json")
    say(f"gpu_check: done in {time.time() - start:.0f} s; {out}: " + ", ".join(sorted(f.name for f in out.iterdir())))
    log.close()
    print(summary)  # the table last: the call's output tail is what comes back first
    problems = check_output_folder(out)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    return 1 if problems else 0


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
    if target.stat().st_size > OUT_FILE_BYTES:  # drop the bulkiest (per-step answers) before giving up figures
        with tarfile.open(target, "w:gz") as tar:
            tar.add(work, arcname="gpu_check", filter=lambda t: None if t.name.endswith("answers.jsonl") else t)


def check_output_folder(out: Path) -> list[str]:
    """What would not come back from the node: too many files, too large, too deep, odd names."""
    import re

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


def summary_markdown(results: dict, work: Path, cpu: bool) -> str:
    lines = ["# gpu_check" + (" (CPU rehearsal)" if cpu else ""), ""]
    env_file = work / "env.json"
    if env_file.is_file():
        env = json.loads(env_file.read_text())
        lines += [f"{env.get('gpu') or 'no GPU'}; Python {env.get('python')}; torch {env.get('torch')} (CUDA "
                  f"{env.get('cuda')}); transformers {env.get('transformers')}; {env.get('nvidia_smi', '')}", ""]
    lines += cost_lines(work)
    for name in ("real_model", "real_model_bf16", "real_model_compiled"):
        lines += method_lines(results.get(name, {}), name)
    profile = work / "step_profile" / "step_profile.md"
    if profile.is_file():
        lines += ["#" + profile.read_text().strip(), ""]
    lines += ["## Stages", "", "| stage | status | seconds | budget | detail |", "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['status']} | {r.get('seconds', 0):.0f} | {r.get('budget', '-')} | "
                     f"{str(r.get('detail', '')).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def cost_lines(work: Path) -> list[str]:
    curves = sorted((work / "cost").glob("cost_*.json")) if (work / "cost").is_dir() else []
    if not curves:
        return []
    sys.path.insert(0, str(ROOT))  # the node runs the checkout as it is: specbench is not installed there
    from specbench.speculation.cost import CostCurve

    lines = ["## Cost curves (random weights)", "",
             "| shape | forward | dtype | t(1) ms | t(81)/t(1) | t(128)/t(1) | t(1)/floor(1) |", "|---|---|---|---|---|---|---|"]
    for f in curves:
        c = CostCurve.load(f)
        floor = c.floor(1)
        lines.append(f"| {c.model} | {c.forward} | {c.dtype} | {c.t(1) * 1e3:.2f} | {c.t(81) / c.t(1):.2f} | "
                     f"{c.t(128) / c.t(1):.2f} | {'-' if not floor else f'{c.t(1) / floor:.1f}'} |")
    lines.append("")
    for f in sorted((work / "cost").glob("predictions_*.md")):
        lines += [f"### {f.stem.removeprefix('predictions_')}", "", f.read_text().strip(), ""]
    return lines


def method_lines(result: dict, name: str) -> list[str]:
    rows = [r for r in result.get("rows", []) if "mat" in r]
    if not rows:
        return []
    f = lambda v, fmt: "-" if v is None else format(v, fmt)
    x = lambda v: "-" if v is None else f"{v:.2f}x"
    lines = [f"## {name}", ""]
    warm = result.get("warmup")
    if warm:
        lines += [f"Warm-up before the first method (AR on one question, not counted): {warm['status']} in "
                  f"{f(warm.get('seconds'), '.0f')} s, AR median step {f(warm.get('ar_step_ms'), '.1f')} ms. "
                  "Each method's AR step should match the others': one far off was disturbed.", ""]
    lines += ["| method | forward | dtype | speedup | decode | bound | MAT | rows/step | tokens/s | AR tokens/s | "
              "step ms | AR step ms | band (ulps; measured logits) | lossless |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r.get('forward_used')} | {r['dtype']} | {x(r['speedup'])} | "
                     f"{x(r['decode_speedup'])} | {x(r['bound'])} | {f(r['mat'], '.2f')} | "
                     f"{f(r['rows_per_step'], '.1f')} | {f(r['tokens_per_s'], '.1f')} | {f(r['ar_tokens_per_s'], '.1f')} | "
                     f"{f(r.get('step_ms'), '.1f')} | {f(r.get('ar_step_ms'), '.1f')} | "
                     f"{f(r.get('band_ulps'), '.0f')}; {f(r.get('band_measured_logits'), '.2g')} | {r['lossless']} |")
    lines += ["", "Each turn's median step (ms) in the order decoded (a: AR, m: the method):", ""]
    lines += [f"- {r['method']}: {' '.join(r['turns'])}" for r in rows if r.get("turns")]
    node = result.get("node")
    if node:
        lines += ["", "The node while it ran: " + ", ".join(f"{k} {v}" for k, v in node.items()) + "."]
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
        p.add_argument("--methods", default="", help=f"comma list for the real-model stages (default: "
                       f"{','.join(LEADING_METHODS)}; all: every registered method)")
    run.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    run.add_argument("--budget", type=int, default=None,
                     help=f"seconds for every stage together (default {TOTAL_BUDGET}; --cpu: {CPU_BUDGET})")
    run.add_argument("--skip", default="", help="comma list of stages not to run")
    args = ap.parse_args(argv)
    if args.command == "stage":
        manifest = stage_carried()
        present, missing = parts_status(manifest)
        print(f"gpu_check stage: {len(present)} of {len(present) + len(missing)} weight parts on this machine "
              f"({NODE_DIR}); missing: {', '.join(missing) or 'none'}")
        return 0
    if args.max_new_tokens is None:
        args.max_new_tokens = MAX_NEW_TOKENS["cpu" if args.cpu else "gpu"]
    if getattr(args, "budget", 0) is None:
        args.budget = CPU_BUDGET if args.cpu else TOTAL_BUDGET
    if args.command == "_stage":
        sys.path.insert(0, str(ROOT))  # as above: not installed on the node (its PYTHONPATH names ROOT too)
        return run_one_stage(args.name, args)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())

"""What each stage of the node's command does. A stage is a function of its context (`ctx`: the work
folder, whether CUDA is used, its deadline, the manifest, the environment of its jobs, its log, the
methods asked for, the runner) to its result: a status, a detail line and whatever it measured."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from specbench.tools.gpu_node import jobs, node, real_model
from specbench.tools.gpu_node.monitor import cgroup_cpu
from specbench.tools.gpu_node.node import FAIL, PASS, ROOT, node_paths

PARTIAL, SKIP_CUDA = "PARTIAL", "SKIP(cuda)"
SHAPES = {"gpu": ["smollm2-135m", "vicuna-7b", "vicuna-13b"], "cpu": ["tiny-135m", "tiny-7b", "tiny-13b"]}
# On a GPU only the model shapes' compiled curves: SmolLM2's comes from the compiled real-model runs
# themselves (their cost_curve.json, the same forward and weights), the eager ones from earlier slots
GPU_CURVES = [("vicuna-7b", "compiled"), ("vicuna-13b", "compiled")]
CURVE_WIDTHS = "1,2,4,8,16,32,64,81,128"  # issue 68's rows
# A cost curve is not started with less than this left (seconds): eager, compiled (inductor, minutes cold)
CURVE_MIN_SECONDS = {"eager": 10, "compiled": 40}

# The cheap eager tests first, the compile-heavy ones (inductor, tens of seconds each on a fresh node)
# last, in a pytest session of their own: the eager session's failures are printed in full before any
# compile starts, so a budget cut still leaves them, and the log names the test that was running
EAGER_CUDA_TESTS = ["tests/test_cuda.py::test_tr_matrix_update_is_deterministic_on_cuda",
                    "tests/test_engine_device.py::test_tr_on_cuda_equals_ar_on_cuda",
                    "tests/test_gpu_readiness.py::test_on_cuda_a_step_synchronises_within_its_budget"]
COMPILED_CUDA_TESTS = [  # the capture and replay of the fixed-shape step first: new since the last lent GPU
    "tests/test_cuda.py::test_replayed_logits_equal_eager_within_the_band",  # three dtypes, tiny model
    "tests/test_cuda.py::test_a_growing_cache_recaptures_for_the_larger_capacity",
    "tests/test_cuda.py::test_a_compiled_step_synchronises_once",  # one compile (float16)
    "tests/test_cuda.py::test_compiled_tr_equals_eager_ar",  # three: float32, float16, bfloat16
    "tests/test_cuda.py::test_compiled_ar_equals_eager_ar_on_a_sliding_window_model",
    "tests/test_cuda.py::test_hidden_state_drafters_decode_as_ar_through_captured_graphs"]  # real model: last
CUDA_TESTS = EAGER_CUDA_TESTS + COMPILED_CUDA_TESTS

# Run in the probe's own Python, with the carried wheels on its path: they must import
PROBE = ("import json, torch, transformers, importlib.metadata as m\n"
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


def install_wheels(wheels: list) -> str | None:
    """The carried wheels into the node's private site folder; the error's tail, or None."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--no-cache-dir", "--upgrade", "--target", str(node_paths()["site"]), *map(str, wheels)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr.strip()[-300:]


def stage_probe(ctx: dict) -> dict:
    """The machine and its libraries; the carried wheels installed into a private folder."""
    import platform

    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "cpus_usable": len(os.sched_getaffinity(0)), "cgroup_cpu_max": cgroup_cpu().get("cpu_max")}
    wheels = sorted(node_paths()["wheels"].glob("*.whl"))
    failed = install_wheels(wheels) if wheels else None
    if failed:
        return {"status": FAIL, "detail": "installing the carried wheels failed: " + failed}
    env["wheels"] = [w.name for w in wheels]
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=ctx["env"])
    if done.returncode != 0:
        return {"status": FAIL, "detail": "probe: " + (done.stderr.strip().splitlines() or ["?"])[-1], "env": env}
    env.update(json.loads(done.stdout.strip().splitlines()[-1]))
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm,"
                              "pstate,persistence_mode,power.limit", "--format=csv,noheader"],
                             capture_output=True, text=True)
        env["nvidia_smi"] = smi.stdout.strip()
    from specbench.environment import check_environment

    check_environment()  # the node's torch and transformers are inside the declared floor
    (ctx["work"] / "env.json").write_text(json.dumps(env, indent=1))
    return {"status": PASS, "detail": f"{env.get('gpu') or 'no GPU'}; torch {env['torch']} (CUDA {env['cuda']}), "
                                      f"transformers {env['transformers']}; {len(wheels)} wheels", "env": env}


def stage_weights(ctx: dict) -> dict:
    return node.assemble_weights(ctx["manifest"])


def cuda_tests_result(c: dict, rc: int | None, out: str, cuda: bool) -> dict:
    """The cuda_tests stage's verdict from pytest's counts and the last session's exit code."""
    detail = f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, {c['error']} errors"
    if rc is None:
        detail += f"; ran out of its budget at: {jobs.last_line(out) or 'no output'}"
        return {"status": FAIL if c["failed"] or c["error"] else PARTIAL, "detail": detail, "counts": c}
    if c["failed"] or c["error"] or rc not in (0, 1, 5):
        if rc not in (0, 1, 5):
            detail += f"; pytest exited {rc}: {jobs.last_line(out) or 'no output'}"
        return {"status": FAIL, "detail": detail, "counts": c}
    if not cuda:
        return {"status": SKIP_CUDA if not c["passed"] else PASS, "detail": detail + " (no GPU here)", "counts": c}
    return {"status": PASS if c["passed"] else FAIL, "detail": detail, "counts": c}


def stage_cuda_tests(ctx: dict) -> dict:
    before = len(jobs.log_text(ctx))
    print(f"gpu_check: cuda_tests: {len(CUDA_TESTS)} selections, the eager ones first", flush=True)
    c = {k: 0 for k in jobs.COUNTS}
    for part, tests in (("eager", EAGER_CUDA_TESTS), ("compiled", COMPILED_CUDA_TESTS)):
        start = len(jobs.log_text(ctx))
        rc = jobs.run_job(jobs.pytest_command(tests, ctx["work"] / f"cuda_tests_{part}.xml"),
                          ctx["deadline"] - time.time(), env=ctx["env"], cwd=ROOT)
        out = jobs.log_text(ctx)[start:]
        closing = jobs.closing_line(out)
        for k, v in (jobs.pytest_counts(closing) if closing else jobs.verbose_counts(out)).items():
            c[k] += v
        if rc is None or (rc not in (0, 1, 5) and not closing):
            break
    return cuda_tests_result(c, rc, jobs.log_text(ctx)[before:], ctx["cuda"])


def curve_job(ctx: dict, shape: str, forward: str, out) -> list[str]:
    cmd = [sys.executable, "-u", "scripts/shape_cost.py", "--shape", shape, "--out", str(out),
           "--device", "cuda" if ctx["cuda"] else "cpu", "--dtype", "float16" if ctx["cuda"] else "float32"]
    if not ctx["cuda"]:  # the stand-ins: the command's path, not figures
        cmd += ["--widths", "1,4,16,81", "--repeats", "2"]
    else:
        cmd += ["--widths", CURVE_WIDTHS]
    return cmd + (["--compile"] if forward == "compiled" else [])


def stage_cost_curves(ctx: dict) -> dict:
    """scripts/shape_cost.py per shape and forward, each in its own process (a 13B model's memory is
    returned when it ends), the eager curves first, the compiled ones only while time is left; the
    curves and prediction tables go to work/cost/, each job's output into the stage's log."""
    out = ctx["work"] / "cost"
    out.mkdir(exist_ok=True)
    todo = GPU_CURVES if ctx["cuda"] else [(s, "eager") for s in SHAPES["cpu"]]
    results, failed = [], []
    for i, (shape, forward) in enumerate(todo):
        left = ctx["deadline"] - time.time()
        if left < CURVE_MIN_SECONDS[forward]:
            failed.append(f"{shape}/{forward}: no time left")
            continue
        # a compiled curve gets only what the eager ones left; an eager one that hangs leaves the next their share
        timeout = left if forward == "compiled" else max(
            CURVE_MIN_SECONDS[forward], left / sum(f == "eager" for _, f in todo[i:]) * 1.5)
        print(f"gpu_check: cost_curves: {shape}/{forward} ({i + 1} of {len(todo)}, {left:.0f} s left)", flush=True)
        before = len(jobs.log_text(ctx))
        rc = jobs.run_job(curve_job(ctx, shape, forward, out), min(timeout, left), env=ctx["env"], cwd=ROOT)
        said = jobs.last_line(jobs.log_text(ctx)[before:])
        if rc is None:
            failed.append(f"{shape}/{forward}: timed out at: {said or 'no output'}")
        elif rc != 0:
            failed.append(f"{shape}/{forward}: " + (said or f"exit {rc}"))
        else:
            results.append(f"{shape}/{forward}")
    detail = f"{len(results)}/{len(todo)} curves" + (f"; {'; '.join(failed)}" if failed else "")
    detail += "" if ctx["cuda"] else "; compiled (CUDA graphs): SKIP(cuda)"
    return {"status": PASS if not failed else (PARTIAL if results else FAIL), "detail": detail, "curves": results,
            "failed": failed, "compiled_fell_back": [f for f in failed if "/compiled" in f]}


def stage_real_model(ctx: dict) -> dict:
    return node.needs_weights(ctx["manifest"]) or real_model.run_methods(
        ctx, "real_model", "float16" if ctx["cuda"] else "float32", "eager", real_model.stage_methods(ctx))


def stage_real_model_compiled(ctx: dict) -> dict:
    if not ctx["cuda"]:
        return {"status": SKIP_CUDA, "detail": "CUDA graphs need a GPU (the CPU's compiled forward is tested in CI)"}
    return node.needs_weights(ctx["manifest"]) or real_model.run_methods(
        ctx, "real_model_compiled", "float16", "compiled", real_model.stage_methods(ctx, default=None),
        rounds=ctx.get("rounds", 1))


def stage_real_model_bf16(ctx: dict) -> dict:
    return node.needs_weights(ctx["manifest"]) or real_model.run_methods(
        ctx, "real_model_bf16", "bfloat16", "eager", real_model.stage_methods(ctx))


def stage_step_profile(ctx: dict) -> dict:
    """scripts/profile_steps.py in a process of its own: PLD's step times by rows verified, with the
    garbage collector on and off and one host thread, and a turn of PLD and of AR under torch's profiler
    (work/step_profile/)."""
    missing = node.needs_weights(ctx["manifest"])
    if missing:
        return missing
    out = ctx["work"] / "step_profile"
    cmd = [sys.executable, "-u", "scripts/profile_steps.py", "--method", "pld", "--out", str(out),
           "--device", "cuda" if ctx["cuda"] else "cpu", "--dtype", "float16" if ctx["cuda"] else "float32"]
    if not ctx["cuda"]:  # the rehearsal: the command's path, not figures
        cmd += ["--prompts", "1", "--max-new-tokens", "12"]
    before = len(jobs.log_text(ctx))
    rc = jobs.run_job(cmd, ctx["deadline"] - time.time(), env=ctx["env"], cwd=ROOT)
    report = out / "step_profile.json"
    if rc is None or rc != 0 or not report.is_file():
        ended = "ran out of its budget" if rc is None else f"exited {rc}"
        return {"status": FAIL, "detail": f"{ended} at: {jobs.last_line(jobs.log_text(ctx)[before:]) or 'no output'}"}
    variants = json.loads(report.read_text())["variants"]
    detail = "; ".join(f"{name}: wider steps {v['several_rows'].get('median_ms', '-')} ms "
                       f"({v['several_rows'].get('slow', 0)}/{v['several_rows']['steps']} slow), one-row "
                       f"{v['one_row'].get('median_ms', '-')} ms" for name, v in variants.items())
    return {"status": PASS, "detail": detail}


STAGE_FUNCTIONS = {"probe": stage_probe, "weights": stage_weights,
                   "real_model_compiled": stage_real_model_compiled, "cost_curves": stage_cost_curves,
                   "cuda_tests": stage_cuda_tests, "real_model_bf16": stage_real_model_bf16,
                   "real_model": stage_real_model, "step_profile": stage_step_profile}


def stage_env(cpu: bool) -> dict:
    """The environment of every stage's process: the private site first, the cache on the node, offline."""
    p = node_paths()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(p["site"]), str(ROOT), env.get("PYTHONPATH")]))
    env.update(SPECBENCH_CACHE=str(p["cache"]), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               WANDB_MODE="disabled", PYTHONUNBUFFERED="1", TORCH_EXTENSIONS_DIR=str(p["cache"] / "torch_extensions"),
               PIP_NO_INDEX="1", TORCHINDUCTOR_CACHE_DIR=str(p["node"] / "inductor"))  # brought back (compile_cache.py)
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env

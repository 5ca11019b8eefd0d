"""Optional accelerators never take a run down (specbench/decoding/forward_choice.py): a kernel that does
not build, a missing C++ compiler or a compile that fails moves the run to the next forward in line,
compiled-packed -> compiled -> eager, with one `warning:` line, and the results name the forward used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench.decoding import forward_choice, packed_linear
from specbench.decoding.compiled import CompiledForward
from specbench.decoding.engine import Engine
from specbench.decoding.forward_choice import ForwardChoice, choose_forward, planned_forward
from specbench.environment import EnvironmentProblem, check_torch_version, declared_minimum
from specbench.methods.ar import Autoregressive
from packaging.version import Version
from tests.conftest import save_tiny_llama_dir

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def test_the_plan_follows_the_settings():
    assert planned_forward("off", "auto", CPU, torch.float32) == "eager"
    assert planned_forward("on", "inductor", CPU, torch.float32) == "compiled"
    assert planned_forward("on", "auto", CPU, torch.bfloat16) == "compiled"  # the kernel is float32 only
    want = "compiled-packed" if packed_linear.available() else "compiled"
    assert planned_forward("on", "auto", CPU, torch.float32) == want
    with pytest.raises(ValueError, match="compile_products=packed needs a float32 model on the CPU"):
        planned_forward("on", "packed", CPU, torch.float16)


def test_auto_compiles_on_cuda_and_x86_cpus_only(monkeypatch):
    """`auto` follows the measurements: compiled on CUDA (the H200: AR's step 8.2 ms against 17.7 ms
    eager) and on x86 CPUs; eager elsewhere. Planning touches no device, so it runs without a GPU."""
    from specbench.decoding import forward_choice

    monkeypatch.setattr(forward_choice.platform, "machine", lambda: "x86_64")
    assert planned_forward("auto", "auto", "cuda", torch.float16) == "compiled"  # the kernel is CPU-only
    assert planned_forward("auto", "auto", CPU, torch.bfloat16) == "compiled"
    assert planned_forward("off", "auto", "cuda", torch.float16) == "eager"
    assert planned_forward("auto", "auto", "mps", torch.float16) == "eager"
    monkeypatch.setattr(forward_choice.platform, "machine", lambda: "aarch64")
    assert planned_forward("auto", "auto", CPU, torch.float32) == "eager"
    assert planned_forward("auto", "auto", "cuda", torch.bfloat16) == "compiled"


def test_without_a_compiler_cuda_is_eager_too(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    choice = choose_forward("auto", "auto", "cuda", torch.float16)
    assert choice.name == "eager" and "compiled forward needs one" in choice.warnings[0]


def test_a_kernel_that_does_not_build_steps_down_to_inductors_products(monkeypatch):
    monkeypatch.setattr(packed_linear, "available", lambda: True)
    monkeypatch.setattr(packed_linear, "build_problem", lambda: "#error C++20 or later compatible compiler is required")
    monkeypatch.setattr(forward_choice, "compiler_problem", lambda: None)
    choice = choose_forward("auto", "auto", CPU, torch.float32)
    assert choice.name == "compiled" and choice.products == "inductor"
    assert len(choice.warnings) == 1
    assert choice.warnings[0].startswith("warning: the packed kernel did not build here (#error C++20")


def test_a_cpu_without_avx2_gets_inductors_products_and_is_told(monkeypatch):
    monkeypatch.setattr(packed_linear, "available", lambda: False)
    monkeypatch.setattr(forward_choice, "compiler_problem", lambda: None)
    choice = choose_forward("on", "auto", CPU, torch.float32)
    assert choice.name == "compiled"
    assert choice.warnings[0].startswith("warning: the packed kernel is unavailable (it needs an x86-64 CPU with AVX2")


def test_an_older_torch_is_refused_in_one_line():
    low = declared_minimum("torch")
    assert low == Version("2.11")  # pyproject.toml's lower bound: the offline GPU node's torch
    with pytest.raises(EnvironmentProblem, match=r"^torch 2.10.0 is older than the oldest supported, 2.11; "
                                                 r"install a newer one: pip install -U 'torch>=2.11' \(offline"):
        check_torch_version("2.10.0")
    check_torch_version(torch.__version__)
    check_torch_version("2.11.0+cu130")  # the node's build passes


def test_the_floor_is_the_same_installed_or_not(monkeypatch):
    """A checkout run as it is (a cluster node) reads pyproject.toml; without it, the installed metadata."""
    from specbench import environment

    assert environment.declared_minimum("transformers") == Version("5.17")
    monkeypatch.setattr(environment, "PYPROJECT", environment.PYPROJECT.with_name("no-such.toml"))
    monkeypatch.setattr(environment.metadata, "requires", lambda name: ["torch>=2.11", "transformers>=5.17,<6"])
    assert environment.declared_minimum("torch") == Version("2.11")
    with pytest.raises(EnvironmentProblem, match=r"^transformers 5.16.0 is older than the oldest supported, 5.17"):
        environment.check_version("transformers", "5.16.0")


def test_without_a_compiler_the_run_is_eager(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    choice = choose_forward("on", "auto", CPU, torch.float32)
    assert choice == ForwardChoice("eager", choice.warnings)
    assert choice.warnings[0].startswith("warning: no C++ compiler (/nonexistent/g++ not found; install one")
    assert choose_forward("off", "auto", CPU, torch.float32) == ForwardChoice("eager")  # nothing tried, nothing said


def test_the_build_log_is_reduced_to_its_error():
    log = ("Error building extension 'specbench_packed_linear': [1/2] c++ -MMD -MF packed_linear.o.d -O3\n"
           "/x/torch/include/c10/util/C++17.h:13:2: error: #error C++20 or later compatible compiler is required\n"
           "ninja: build stopped: subcommand failed.")
    assert packed_linear.first_error_line(log) == "#error C++20 or later compatible compiler is required"


def test_an_engine_whose_compile_fails_goes_on_eager(tiny_llama, monkeypatch, capsys):
    def fail(self, cache, hidden):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(CompiledForward, "prepare", fail)
    prompt = [1, 5, 9, 5, 9, 12, 40, 3]
    engine = Engine(tiny_llama, eos_token_ids=[], compiled=True, products="inductor")
    assert engine.forward_name == "compiled"
    out = engine.generate(prompt, Autoregressive(), 12)
    assert engine.forward_name == "eager"
    assert out.tokens == Engine(tiny_llama, eos_token_ids=[]).generate(prompt, Autoregressive(), 12).tokens
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert err == ["warning: the compiled forward failed (RuntimeError: InvalidCxxCompiler: No working C++ compiler found): "
                   "continuing on the eager forward"]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, real_model) -> Path:
    """A two-layer random Llama with the embedded model's tokenizer, saved as a local model directory: a
    real `python run.py model=hf` whose compile takes seconds, not minutes."""
    return save_tiny_llama_dir(tmp_path_factory.mktemp("tiny_hf"), real_model[1], max_positions=2048)


def _run(model_dir: Path, out: Path, env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [sys.executable, "run.py", "model=hf", f"model.path={model_dir}", "compile=on", "task=mini",
           "task.limit=1", "max_new_tokens=6", "warmup=0", "cost_curve=off", "wandb.enabled=false",
           "progress=false", f"results_dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    return done, summary


def test_run_completes_on_inductors_products_when_the_kernel_build_fails(tiny_model_dir, tmp_path):
    """The build made to fail for real (an #error at the top of the kernel's source, through the flags
    a user can set), in its own extensions folder so the machine's built kernel is left alone."""
    if not packed_linear.available():
        pytest.skip("the packed kernel is not planned on this CPU (no AVX2): nothing to fall back from")
    done, summary = _run(tiny_model_dir, tmp_path / "run", {
        # -Wfatal-errors: g++ stops at the #error instead of compiling torch's headers after it (23 s)
        packed_linear.EXTRA_CFLAGS_ENV: "-DSPECBENCH_BREAK_BUILD -Wfatal-errors",
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("warning:")]
    assert warnings == ["warning: the packed kernel did not build here (#error SPECBENCH_BREAK_BUILD is set: a "
                        "build failure made on purpose): the compiled forward uses inductor's matrix products"]
    assert summary["forward"] == "compiled" and summary["lossless"]["mismatches"] == 0


def test_run_completes_eager_without_a_compiler(tiny_model_dir, tmp_path):
    done, summary = _run(tiny_model_dir, tmp_path / "run", {"CXX": "/bin/false"})
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("warning:")]
    assert warnings == ["warning: the C++ compiler /bin/false does not run (install a working one, e.g. g++, or "
                        "set CXX): the compiled forward needs one, so this run uses the eager forward"]
    assert summary["forward"] == "eager"


def _plan_with_curve(tmp_path, monkeypatch, choice: ForwardChoice):
    """plan_run for compile=on with inductor's products (planned: `compiled`) and a curve file measured
    on that forward, this machine building `choice` of it."""
    from specbench.run import plan as run_plan
    from specbench.speculation.cost import CostCurve
    from tests.test_config import cfg

    curve = tmp_path / "curve.json"
    CostCurve(widths=[1, 2], times=[1.0, 1.1], forward="compiled").save(curve)
    monkeypatch.setattr(run_plan, "choose_forward", lambda *a: choice)
    given = cfg("task=mini", "compile=on", "compile_products=inductor", f"cost_curve={curve}",
                f"results_root={tmp_path}")
    return run_plan.plan_run(given), str(curve)


def test_a_run_that_steps_down_measures_a_curve_of_its_own(tmp_path, monkeypatch, capsys):
    """The curve file was measured on the forward the settings ask for; a run that gets less measures a
    quick curve on the forward it runs, and says so."""
    plan, _ = _plan_with_curve(tmp_path, monkeypatch, ForwardChoice("eager", ("warning: no compiler",)))
    assert (plan.forward, plan.settings.cost_curve) == ("eager", "auto")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "warning: no compiler" and "was measured on another forward" in err[1]


def test_a_warning_that_keeps_the_planned_forward_keeps_the_curve(tmp_path, monkeypatch, capsys):
    plan, curve = _plan_with_curve(tmp_path, monkeypatch, ForwardChoice("compiled", ("warning: no kernel",)))
    assert (plan.forward, plan.settings.cost_curve) == ("compiled", curve)
    assert capsys.readouterr().err.splitlines() == ["warning: no kernel"]

"""The GPU node's prepared command (specbench/tools/gpu_node/, run by scripts/gpu_check.py and packed
by scripts/gpu_pack.py): the call plan fits what a call may carry, carried parts gather on the node and
assemble only when whole and checked, what comes back is within the node's limits, and the stage
results read pytest's and the runner's figures right. The whole command runs in CI's rehearsal
(scripts/rehearse_gpu_check.sh)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbench.tools.gpu_node import driver, jobs, limits, node, pack, real_model, stages, summary
from specbench.intervals import round_stats
from specbench.tools.gpu_node.monitor import NodeSampler

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # profile_cost, for the walls below

MiB = 1 << 20


def _manifest(tmp_path: Path, blob: bytes, cut: int) -> dict:
    parts = [blob[:cut], blob[cut:]]
    manifest = {"weights": {"model": "m", "file": "w.gguf", "size": len(blob),
                            "sha256": hashlib.sha256(blob).hexdigest(), "parts": []}}
    for i, data in enumerate(parts, 1):
        call = tmp_path / ".gpu" / f"call{i}"
        (call / "parts").mkdir(parents=True)
        (call / "parts" / f"w.gguf.part{i}").write_bytes(data)
        manifest["weights"]["parts"].append({"name": f"w.gguf.part{i}", "size": len(data), "call": i,
                                             "sha256": hashlib.sha256(data).hexdigest()})
    for i in (1, 2):
        (tmp_path / ".gpu" / f"call{i}" / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_parts_gather_across_calls_and_assemble_only_when_whole(tmp_path, monkeypatch):
    node_dir = tmp_path / "node"
    monkeypatch.setattr(node, "NODE_DIR", node_dir)
    blob = bytes(range(256)) * 40
    manifest = _manifest(tmp_path, blob, 3000)
    call2 = tmp_path / ".gpu" / "call2"
    moved = tmp_path / "later"
    call2.rename(moved)  # the first call carries call1 only
    node.stage_carried(tmp_path / ".gpu", node_dir)
    assert node.parts_status(manifest, node_dir) == (["w.gguf.part1"], ["w.gguf.part2"])
    ctx = {"manifest": manifest}
    result = stages.stage_weights(ctx)
    assert result["status"] == "FAIL" and "w.gguf.part2 never reached this machine" in result["detail"]
    (tmp_path / ".gpu" / "call1").rename(tmp_path / "done")  # the next call: the node kept part 1
    moved.rename(call2)
    node.stage_carried(tmp_path / ".gpu", node_dir)
    assert stages.stage_weights(ctx)["status"] == "PASS"
    assert node.embedded_gguf_path(manifest).read_bytes() == blob


def test_a_corrupt_part_is_refused(tmp_path, monkeypatch):
    node_dir = tmp_path / "node"
    monkeypatch.setattr(node, "NODE_DIR", node_dir)
    manifest = _manifest(tmp_path, b"x" * 5000, 100)
    (tmp_path / ".gpu" / "call2" / "parts" / "w.gguf.part2").write_bytes(b"y" * 4900)
    node.stage_carried(tmp_path / ".gpu", node_dir)
    result = stages.stage_weights({"manifest": manifest})
    assert result == {"status": "FAIL", "detail": "part w.gguf.part2 does not match its sha256"}
    assert not node.embedded_gguf_path(manifest).exists()


def test_the_output_folder_is_checked_against_what_comes_back(tmp_path):
    assert limits.check_output_folder(tmp_path) == []
    for i in range(9):
        (tmp_path / f"f{i}.txt").write_text("x")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "odd name.txt").write_text("x")
    problems = limits.check_output_folder(tmp_path)
    assert any("11 files" in p for p in problems)
    assert any("more than two folders down" in p for p in problems)
    assert any("odd name.txt" in p for p in problems)


def test_pytest_counts_and_method_order():
    assert jobs.pytest_counts("3 passed, 1 failed, 12 skipped, 2 errors in 4.1s") == \
        {"passed": 3, "failed": 1, "skipped": 12, "error": 2}
    assert jobs.pytest_counts("12 skipped in 0.5s")["skipped"] == 12
    order = real_model.method_order(["ar", "pld", "zeta", "tr", "alpha", "tr_fused"])
    assert order == ["tr_fused", "tr", "pld", "alpha", "zeta"]
    assert real_model.method_order(["ar", "pld", "tr"], ["pld"]) == ["pld"]


def test_pytest_verbose_output_is_counted_when_the_run_never_ended():
    log = ("tests/a.py::test_one PASSED     [ 25%]\ntests/a.py::test_two[torch.float16] SKIPPED (needs a CUDA GPU) [ 50%]\n"
           "tests/a.py::test_three FAILED  [ 75%]\ntests/b.py::test_four ")
    assert jobs.closing_line(log) is None
    assert jobs.verbose_counts(log) == {"passed": 1, "failed": 1, "skipped": 1, "error": 0}
    assert jobs.last_line(log) == "tests/b.py::test_four"
    ended = log + "PASSED [100%]\n\n=========== 2 passed, 1 failed, 1 skipped in 3.20s ===========\n"
    assert jobs.pytest_counts(jobs.closing_line(ended)) == {"passed": 2, "failed": 1, "skipped": 1, "error": 0}


def test_the_last_line_skips_progress_bars_and_library_logging():
    log = ("gpu_check: real_model_compiled: tr (80 s left)\n"
           "compiling the compiled forward for a cache of 2048 rows before anything is timed\n"
           "Loading weights:   0%|          | 0/272 [00:00<?, ?it/s]\rLoading weights: 100%|##| 272/272 [00:00, 25149.37it/s]\n"
           "/opt/torch/_inductor/compile_fx.py:322: UserWarning: TensorFloat32 tensor cores ... not enabled.\n"
           "  warnings.warn(\n"
           "W1126 16:28:25.395000 2572 torch/_inductor/cudagraph_utils.py:207] [__cudagraphs] skipping cudagraphs\n"
           "W1126 16:28:25.395000 2572 torch/_inductor/cudagraph_utils.py:207] [__cudagraphs] \n\n")
    assert jobs.last_line(log).startswith("compiling the compiled forward for a cache of 2048 rows")
    assert jobs.last_line("\n  \n") is None


def test_the_cuda_tests_run_eager_first_and_compile_heavy_last():
    """A budget cut leaves the eager results: no selection that compiles comes before one that does not."""
    import ast

    compiles = []
    for selection in stages.CUDA_TESTS:
        path, name = selection.split("::")
        tree = ast.parse((ROOT / path).read_text())
        fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        assert fn, f"{selection} names no test"
        compiles.append("compiled=True" in ast.unparse(fn[0]))
    assert compiles == sorted(compiles) and compiles[0] is False and compiles[-1] is True
    assert "-v" in jobs.pytest_command(stages.CUDA_TESTS, Path("x.xml"))


def test_a_stage_its_budget_ends_leaves_its_progress_and_nothing_running(tmp_path):
    """The stage's process runs pytest (a job writing into the stage's log, as cuda_tests does); the
    budget ends it during the second test: the log keeps the first test's outcome and the second's
    node id, the detail names it, and neither the stage nor pytest runs on."""
    (tmp_path / "test_two.py").write_text(
        "import os, time\n"
        "def test_fast():\n    pass\n"
        "def test_slow():\n"
        f"    open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(120)\n")
    stage = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from specbench.tools.gpu_node import jobs; "
             "print('gpu_check: cuda_tests: 2 tests, the fast one first'); "
             f"jobs.run_job(jobs.pytest_command(['test_two.py'], {str(tmp_path / 'x.xml')!r}), 120, "
             f"cwd={str(tmp_path)!r})")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    (tmp_path / "work").mkdir()
    log = tmp_path / "work" / "cuda_tests.log"
    t0 = time.time()
    budget = 20  # pytest reaches test_slow in a few seconds, on a loaded machine too
    assert jobs.run_stage_process([sys.executable, "-c", stage], log, budget, env, cwd=tmp_path)
    assert time.time() - t0 < budget + 2
    text = log.read_text()
    assert "gpu_check: cuda_tests: 2 tests, the fast one first" in text
    assert "test_two.py::test_fast PASSED" in text
    result = driver.stage_result(tmp_path / "work", "cuda_tests", timed_out=True)
    assert result == {"status": "PARTIAL", "detail": "ran past its budget at: test_two.py::test_slow"}
    pid = int((tmp_path / "pid").read_text())
    for _ in range(50):  # killed with its stage; its new parent reaps it
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"pytest (pid {pid}) still runs after its stage was killed")


def test_a_job_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    child = f"import os, time; open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    job = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    assert jobs.run_job([sys.executable, "-c", job], 3) is None
    pid = int((tmp_path / "pid").read_text())
    for _ in range(50):
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the job's child runs on")


def test_every_stage_has_a_function_and_the_budgets_fit_a_call():
    names = [s.name for s in limits.STAGES]
    assert names == list(stages.STAGE_FUNCTIONS)
    # issue 68's order for a short slot: every method compiled (the step's split recorded by its runs),
    # the 7B/13B curves, the CUDA tests, then bfloat16 and eager with whatever is left
    assert names[:5] == ["probe", "weights", "real_model_compiled", "cost_curves", "cuda_tests"]
    assert limits.TOTAL_BUDGET <= 570  # a call runs at most 600 s
    assert sum(s.gpu_budget for s in limits.STAGES) + limits.ARCHIVE_SECONDS + limits.MARGIN_SECONDS \
        <= limits.TOTAL_BUDGET
    assert sum(s.cpu_budget for s in limits.STAGES) + limits.ARCHIVE_SECONDS <= limits.CPU_BUDGET
    # every method compiled, once at least: a warm-up that compiles three row buckets (84 s on the
    # H200, 2026-11-27), each method about 5 s at 32 new tokens, and the hidden-state graphs once more
    assert real_model.MAX_NEW_TOKENS["gpu"] <= 32
    assert limits.STAGES[names.index("real_model_compiled")].gpu_budget >= 84 + 11 * 5 + 72


def test_a_round_of_every_method_comes_before_any_method_twice(tmp_path, monkeypatch):
    """Rounds interleave the methods: a slot that runs out still has every method once."""
    calls = []

    def runner(over):
        calls.append(next(o for o in over if o.startswith("method=")))
        raise KeyboardInterrupt if len(calls) > 99 else RuntimeError("no model here")

    ctx = {"work": tmp_path, "cuda": False, "deadline": 1e18, "max_new_tokens": 4, "runner": runner,
           "methods": None}
    res = real_model.run_methods(ctx, "real_model", "float32", "eager", ["pld", "tr"], rounds=2)
    assert calls == ["method=ar", "method=pld", "method=tr", "method=pld", "method=tr"]
    assert [(r["method"], r["round"]) for r in res["rows"]] == [("pld", 1), ("tr", 1), ("pld", 2), ("tr", 2)]


def test_the_warm_up_builds_our_kernels_so_the_first_method_does_not(tmp_path, monkeypatch):
    """The extension's first build (minutes on a new node) falls in the warm-up, said in its line; a
    build that fails is said there too, and the methods still run."""
    from specbench.decoding import packed_linear

    built = []
    monkeypatch.setattr(packed_linear, "build_problem", lambda: built.append(1) or None)
    ctx = {"work": tmp_path, "cuda": False, "runner": lambda over: ({}, 0, "")}
    warm = real_model.warm_up(ctx, "real_model", ["model=smollm2-135m"])
    assert built == [1] and warm["kernels"] == "built" and warm["status"] == "ok"
    monkeypatch.setattr(packed_linear, "build_problem", lambda: "no g++ here")
    assert real_model.warm_up(ctx, "real_model", [])["kernels"] == "unavailable: no g++ here"
    text = "\n".join(summary.method_lines({"rows": [TABLE_ROW], "warmup": warm}, "real_model"))
    assert "our CPU kernels built in" in text


def test_a_stage_gets_its_budget_and_what_earlier_stages_left_unused():
    stages = [limits.Stage(n, b, b, "") for n, b in (("a", 100), ("b", 50), ("c", 30))]
    assert limits.stage_budget(stages, 0, 180, cpu=False) == 100
    assert limits.stage_budget(stages, 0, 200, cpu=False) == 120  # 20 s more than the three are sure of
    assert limits.stage_budget(stages, 1, 110, cpu=False) == 80  # 'a' left 30 s unused
    assert limits.stage_budget(stages, 1, 110, cpu=False, skip={"c"}) == 110
    assert limits.stage_budget(stages, 2, 60, cpu=False) == 60  # the last takes what is left
    assert limits.stage_budget(stages, 1, 40, cpu=False) == 40  # never more than is left


def test_the_rehearsal_accepts_a_stage_short_of_time_only_when_nothing_failed():
    """A slow CPU may run out of a best-effort stage's time (CI, 2026-12-01: bfloat16 1/5 methods);
    a failed method, a stage with none done, or another status is still refused."""
    ok, skip = {"method": "tr_fused", "status": "ok"}, {"method": "tr", "status": real_model.SKIP_TIME}
    warm = {"status": "ok"}
    short = real_model.methods_result([ok, skip], warm, {}, "bfloat16", "eager")
    assert short["status"] == "PARTIAL" and real_model.short_of_time_only(short)
    failed = real_model.methods_result([ok, {"method": "pld", "status": "RuntimeError: x"}, skip], warm, {},
                                       "bfloat16", "eager")
    assert failed["status"] == "FAIL" and not real_model.short_of_time_only(failed)
    assert not real_model.short_of_time_only(real_model.methods_result([skip], warm, {}, "bfloat16", "eager"))
    # a stage its budget ended: the driver keeps the rows finished; one that failed is no time shortage
    assert not real_model.short_of_time_only({"status": "PARTIAL", "rows": [ok, {"method": "pld", "status": "x"}]})
    assert not real_model.short_of_time_only({"status": "PASS", "rows": [ok]})
    assert {st.name for st in limits.STAGES if st.gpu_budget == 0} == {"real_model_bf16", "real_model", "step_profile"}


def test_step_medians_come_from_the_runs_answers(tmp_path):
    def write(name, times):
        rows = [{"question_id": i, "turns": [{"step_times": t} for t in turns]} for i, turns in enumerate(times)]
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    write("answers.jsonl", [[[0.010, 0.030]], [[0.020], [0.040, 0.050]]])
    write("baseline_answers.jsonl", [[[0.056, 0.056, 0.020]]])
    assert real_model.step_medians({"results_dir": str(tmp_path)}) == {"step_ms": 30.0, "ar_step_ms": 56.0}
    assert real_model.step_medians({}) == {"step_ms": None, "ar_step_ms": None}


TABLE_ROW = {"method": "tr", "forward_used": "eager", "dtype": "float16", "speedup": 1.5, "decode_speedup": 1.6,
             "bound": 2.0, "mat": 2.1, "rows_per_step": 81.0, "tokens_per_s": 70.0, "ar_tokens_per_s": 45.0,
             "step_ms": 30.0, "ar_step_ms": 20.5, "lossless": "exact", "status": "ok"}


def test_the_method_table_shows_each_methods_step_and_ar_step():
    lines = summary.method_lines({"rows": [TABLE_ROW], "warmup": {"status": "ok", "seconds": 60.0, "ar_step_ms": 21.0}},
                                   "real_model")
    text = "\n".join(lines)
    assert "| step ms | AR step ms |" in text and "| 30.0 | 20.5 |" in text
    assert "AR median step 21.0 ms" in text


def test_rounds_and_the_step_split_show_in_the_summary():
    def row(rnd, sp):
        return {"method": "pld", "round": rnd, "forward_used": "compiled", "dtype": "float16", "speedup": sp,
                "decode_speedup": sp, "bound": 1.4, "predicted": 1.3, "mat": 1.3, "rows_per_step": 5.0,
                "tokens_per_s": 9.0, "ar_tokens_per_s": 8.0, "lossless": "exact", "status": "ok",
                "tokens_checked": 224, "tokens_outside_band": 0, "mismatches": 0,
                "step_split_ms": {"propose": 0.1, "forward": 0.5}, "ar_step_split_ms": {"propose": 0.0, "forward": 0.4}}
    rows = [row(1, 1.2), row(2, 1.3), row(3, 1.1)]
    result = {"rows": rows, "rounds": {"pld": round_stats([1.2, 1.3, 1.1])}}
    text = "\n".join(summary.method_lines(result, "real_model_compiled"))
    assert "| pld (2) |" in text and "| pld | 3 | 1.20x | 1.10x-1.30x |" in text and "| 672 | 0 | 0 |" in text
    assert "| pld | 0.100 | 0.500 | 0.600 | 0.000 | 0.400 | 0.400 |" in text


@pytest.mark.parametrize("cuda", [False, True])
@pytest.mark.parametrize("questions", [False, True])
def test_the_real_model_settings_and_the_warm_up_compose(tmp_path, monkeypatch, cuda, questions):
    """The methods' settings and the warm-up's (AR on one question) are valid settings."""
    from hydra import compose, initialize_config_dir

    monkeypatch.setattr(node, "NODE_DIR", tmp_path)
    if questions:
        (tmp_path / "questions").mkdir()
        (tmp_path / "questions" / "question.jsonl").write_text("")
    ctx = {"cuda": cuda, "max_new_tokens": 32}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        for warm_up in (False, True):
            over = real_model.real_model_overrides(ctx, "float16", "eager", tmp_path, warm_up=warm_up)
            cfg = compose("config", overrides=["method=ar" if warm_up else "method=tr", *over])
            assert cfg.max_new_tokens == 32
            if warm_up and questions:
                # the GPU's: the longest prompt, whose capacity serves every method; the CPU's: its shortest
                want = real_model.WARMUP_SUBTASK if cuda else real_model.CPU_SUBTASKS["half"][0]
                assert list(cfg.task.subtasks) == [want] and cfg.task.per_subtask == 1
            elif warm_up:
                assert cfg.task.limit == 1
            repeats = real_model.WARMUP_REPEATS if cuda else real_model.CPU_WARMUP_REPEATS
            assert cfg.warmup == (repeats if warm_up else 1)


def test_the_cpu_rehearsal_takes_one_question_in_half_precision(tmp_path, monkeypatch):
    """On a CPU half precision is several times slower: its stage takes one question, float32's two
    (CI's rehearsal must fit every leading method); a GPU takes no subtask filter."""
    monkeypatch.setattr(node, "NODE_DIR", tmp_path)
    (tmp_path / "questions").mkdir()
    (tmp_path / "questions" / "question.jsonl").write_text("")

    def subtasks(cuda, dtype):
        over = real_model.real_model_overrides({"cuda": cuda, "max_new_tokens": 16}, dtype, "eager", tmp_path)
        return [o for o in over if o.startswith("task.subtasks=")]

    assert subtasks(False, "bfloat16") == subtasks(False, "float16") == ["task.subtasks=[translation]"]
    assert subtasks(False, "float32") == ["task.subtasks=[translation,math_reasoning]"]
    assert subtasks(True, "bfloat16") == []


# -- the walls a sweep on the node would have hit ----------------------------------------------------

def test_a_failing_job_does_not_end_a_multirun(real_model, tmp_path):
    """A job that exits (here: max_new_tokens=0, refused) is recorded; the next job still runs, and the
    process exits with the worst code (Hydra stops at a SystemExit, so jobs return their codes)."""
    import subprocess

    proc = subprocess.run([sys.executable, "run.py", "-m", "method=pld", "task=mini", "task.limit=1",
                           "max_new_tokens=0,4", "warmup=0", "compile=off", "cost_curve=off", "progress=false",
                           "wandb.enabled=false", f"results_root={tmp_path}", f"hydra.sweep.dir={tmp_path}/multirun"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: max_new_tokens must be at least 1, got 0" in proc.stderr
    assert (tmp_path / "smollm2-135m" / "mini-l1" / "pld-t0-m4" / "summary.json").is_file()


def test_a_compiled_profile_that_fell_back_writes_no_curve(real_model, tmp_path, monkeypatch, capsys):
    import profile_cost

    from specbench.decoding import compiled

    def fail(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(compiled.CompiledForward, "__init__", fail)
    out = tmp_path / "curve.json"
    code = profile_cost.main(["--widths", "2", "--repeats", "1", "--warmup", "0", "--context", "8", "--compile",
                              "--out", str(out), "--no-cache"])
    assert code == 2 and not out.exists()
    assert "error: --compile was asked for but the compiled forward could not run here" in capsys.readouterr().err


def test_turn_timeline_lists_each_turns_median_step_in_the_order_decoded(tmp_path):
    def answers(name, qid, turns):
        with (tmp_path / name).open("a") as f:
            f.write(json.dumps({"question_id": qid, "turns": [{"step_times": t} for t in turns]}) + "\n")

    answers("answers.jsonl", 1, [[0.020, 0.030, 0.025], [0.080]])
    answers("baseline_answers.jsonl", 1, [[0.019], [0.058]])
    answers("answers.jsonl", 2, [[0.023]])
    answers("baseline_answers.jsonl", 2, [[0.064]])
    summary = {"results_dir": str(tmp_path), "order": {"first": {"1": "ar", "2": "method"}}}
    assert real_model.turn_timeline(summary) == ["a19", "a58", "m25", "m80", "m23", "a64"]


def test_node_sampler_summarises_the_gpu_clocks_it_sampled(tmp_path, monkeypatch):
    # a stand-in nvidia-smi: csv header, then three samples, the second at a dropped clock
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], pstate, "
                   "utilization.gpu [%], power.draw [W], temperature.gpu'\n"
                   "echo '2026/11/26 16:38:00.000, 1980, 2619, P0, 40, 150.0, 40'\n"
                   "echo '2026/11/26 16:38:00.250, 345, 2619, P2, 5, 70.0, 40'\n"
                   "echo '2026/11/26 16:38:00.500, 1980, 2619, P0, 45, 155.0, 41'\nsleep 30\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sampler = NodeSampler(tmp_path, "real_model")
    time.sleep(1.0)
    node = sampler.stop()
    assert (node["samples"], node["sm_mhz_min"], node["sm_mhz_median"], node["sm_mhz_max"]) == (3, 345, 1980, 1980)
    assert node["pstates"] == ["P0", "P2"] and (tmp_path / "real_model_gpu_samples.csv").is_file()

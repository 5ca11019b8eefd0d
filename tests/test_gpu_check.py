"""The GPU node's prepared command (scripts/gpu_check.py, scripts/gpu_pack.py): the call plan fits
what a call may carry, carried parts gather on the node and assemble only when whole and checked,
what comes back is within the node's limits, and the stage results read pytest's and the runner's
figures right. The whole command runs in CI's rehearsal (scripts/rehearse_gpu_check.sh)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402
import gpu_pack  # noqa: E402

MiB = 1 << 20


def test_the_weights_are_spread_over_calls_that_each_fit():
    sizes = gpu_pack.plan_calls(tree=27 * MiB, fixed=MiB, weights=94 * MiB)
    room = 64 * MiB - 27 * MiB - gpu_pack.MARGIN
    assert sum(sizes) == 94 * MiB and len(sizes) == 3
    assert sizes[0] + MiB <= room and all(s <= room for s in sizes[1:])


def test_a_checkout_too_large_to_carry_anything_is_refused():
    with pytest.raises(SystemExit, match="nothing is left of a call's 64 MiB"):
        gpu_pack.plan_calls(tree=63 * MiB, fixed=MiB, weights=10 * MiB)


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
    node = tmp_path / "node"
    monkeypatch.setattr(gpu_check, "NODE_DIR", node)
    blob = bytes(range(256)) * 40
    manifest = _manifest(tmp_path, blob, 3000)
    call2 = tmp_path / ".gpu" / "call2"
    moved = tmp_path / "later"
    call2.rename(moved)  # the first call carries call1 only
    gpu_check.stage_carried(tmp_path / ".gpu", node)
    assert gpu_check.parts_status(manifest, node) == (["w.gguf.part1"], ["w.gguf.part2"])
    ctx = {"manifest": manifest}
    result = gpu_check.stage_weights(ctx)
    assert result["status"] == "FAIL" and "w.gguf.part2 never reached this machine" in result["detail"]
    (tmp_path / ".gpu" / "call1").rename(tmp_path / "done")  # the next call: the node kept part 1
    moved.rename(call2)
    gpu_check.stage_carried(tmp_path / ".gpu", node)
    assert gpu_check.stage_weights(ctx)["status"] == "PASS"
    assert gpu_check.embedded_gguf_path(manifest).read_bytes() == blob


def test_a_corrupt_part_is_refused(tmp_path, monkeypatch):
    node = tmp_path / "node"
    monkeypatch.setattr(gpu_check, "NODE_DIR", node)
    manifest = _manifest(tmp_path, b"x" * 5000, 100)
    (tmp_path / ".gpu" / "call2" / "parts" / "w.gguf.part2").write_bytes(b"y" * 4900)
    gpu_check.stage_carried(tmp_path / ".gpu", node)
    result = gpu_check.stage_weights({"manifest": manifest})
    assert result == {"status": "FAIL", "detail": "part w.gguf.part2 does not match its sha256"}
    assert not gpu_check.embedded_gguf_path(manifest).exists()


def test_the_output_folder_is_checked_against_what_comes_back(tmp_path):
    assert gpu_check.check_output_folder(tmp_path) == []
    for i in range(9):
        (tmp_path / f"f{i}.txt").write_text("x")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "odd name.txt").write_text("x")
    problems = gpu_check.check_output_folder(tmp_path)
    assert any("11 files" in p for p in problems)
    assert any("more than two folders down" in p for p in problems)
    assert any("odd name.txt" in p for p in problems)


def test_pytest_counts_and_method_order():
    assert gpu_check.pytest_counts("3 passed, 1 failed, 12 skipped, 2 errors in 4.1s") == \
        {"passed": 3, "failed": 1, "skipped": 12, "error": 2}
    assert gpu_check.pytest_counts("12 skipped in 0.5s")["skipped"] == 12
    order = gpu_check.method_order(["ar", "pld", "zeta", "tr", "alpha", "tr_fused"])
    assert order == ["tr", "tr_fused", "pld", "alpha", "zeta"]
    assert gpu_check.method_order(["ar", "pld", "tr"], ["pld"]) == ["pld"]


def test_every_stage_has_a_function_and_the_budgets_fit_a_call():
    assert [s.name for s in gpu_check.STAGES] == list(gpu_check.STAGE_FUNCTIONS)
    assert sum(s.gpu_budget for s in gpu_check.STAGES) <= 600 + 200  # later stages take what is left
    assert gpu_check.TOTAL_BUDGET <= 570  # a call runs at most 600 s; the archive and a margin need the rest


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

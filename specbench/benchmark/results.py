"""Answers are appended one JSON line at a time, flushed and fsynced, so a killed run loses at
most the question it was on; a rerun reads what is there and resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path


def append_jsonl(path: Path, record: dict) -> None:
    line = json.dumps(record, ensure_ascii=False) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))  # one write call: a line is whole or absent
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict]:
    """Complete lines only: a last line cut by a crash is dropped (and rewritten on resume)."""
    if not path.is_file():
        return []
    records = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            records.append(json.loads(line))
    return records


def repair_jsonl(path: Path) -> list[dict]:
    """Drop a torn last line in place, return the complete records."""
    records = read_jsonl(path)
    if path.is_file():
        data = path.read_bytes()
        keep = data[: data.rfind(b"\n") + 1] if not data.endswith(b"\n") else data
        if keep != data:
            tmp = path.with_suffix(".repair")
            tmp.write_bytes(keep)
            tmp.replace(path)
    return records


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")

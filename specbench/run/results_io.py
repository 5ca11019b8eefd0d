"""Answers are appended one JSON line at a time, written whole, flushed and fsynced before a record
counts, so a killed run loses at most the question it was on; a rerun reads what is there and resumes.

A write that fails part-way (a full disk) is cut back to where the record started, so no half record
ever glues onto the next one; a torn last line left by a killed process is dropped on resume
(`repair_jsonl`). A results folder that cannot be written or read back (read-only, full disk, a
corrupt JSON file) is one `ResultsFileError` line naming the path (run.py prints it, exit 2).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from specbench.errors import ResultsFileError


def _failed(action: str, path: Path, e: OSError) -> ResultsFileError:
    return ResultsFileError(f"cannot {action} {path}: {e.strerror or e}; free space, make the folder writable or "
                            f"give another results_root=... / results_dir=...")


def append_jsonl(path: Path, record: dict) -> None:
    """One record as one line: every byte written (a short write is continued), then fsynced. On a
    failure the file is cut back to its old end and ResultsFileError names it."""
    data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise _failed("write", path, e) from None
    start = None
    try:
        start = _whole_lines_end(fd)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if n <= 0:
                raise OSError(28, "no space left on device (short write)")
            view = view[n:]
        os.fsync(fd)
    except OSError as e:
        if start is not None:
            try:
                os.ftruncate(fd, start)  # no half record stays behind to glue onto the next one
            except OSError:
                pass
        raise _failed("write", path, e) from None
    finally:
        os.close(fd)


def _whole_lines_end(fd: int) -> int:
    """The end of the file's last whole line; a torn tail (a killed writer) is cut off first, so the
    next record starts on a line of its own."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:
        chunk = os.pread(fd, min(65536, end), end - min(65536, end))
        i = chunk.rfind(b"\n")
        if i >= 0:
            end = end - len(chunk) + i + 1
            break
        end -= len(chunk)
    os.ftruncate(fd, end)
    return end


def compressed(path: Path) -> Path:
    """Where a superseded results folder keeps `path` gzipped (its answers kept, small, so the
    checkout that travels to a GPU node stays light: results/README.md names those folders)."""
    return path.with_name(path.name + ".gz")


def jsonl_exists(path: Path) -> bool:
    """`path` is there, as written or gzipped (compressed)."""
    return path.is_file() or compressed(path).is_file()


def read_jsonl(path: Path) -> list[dict]:
    """Complete lines only: a last line cut by a crash is dropped (and rewritten on resume). A whole
    line that is not JSON is ResultsFileError naming the file and line. An archived folder's gzipped
    copy (`compressed`) is read where the file itself is not there."""
    path = Path(path)
    if not path.is_file() and compressed(path).is_file():
        path = compressed(path)
    elif not path.is_file():
        return []
    records = []
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")) as f:
            for lineno, line in enumerate(f, 1):
                if not line.endswith("\n"):
                    break
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ResultsFileError(f"{path}:{lineno}: not valid JSON ({e.msg}); the file is corrupt: "
                                           f"delete that line or the run's directory") from None
    except (OSError, UnicodeDecodeError) as e:
        if isinstance(e, ResultsFileError):
            raise
        raise ResultsFileError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    return records


def read_json(path: Path):
    """A JSON file the run wrote (run_config.json, a side's answers); unreadable or corrupt:
    ResultsFileError naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ResultsFileError(f"{path}: not valid JSON ({e.msg}, line {e.lineno}); the file is corrupt: delete "
                               f"it (or its run's directory) or give another results_dir=...") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ResultsFileError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def repair_jsonl(path: Path) -> list[dict]:
    """Drop a torn last line in place, return the complete records."""
    records = read_jsonl(path)
    if path.is_file():
        data = path.read_bytes()
        keep = data[: data.rfind(b"\n") + 1] if not data.endswith(b"\n") else data
        if keep != data:
            tmp = path.with_suffix(".repair")
            try:
                tmp.write_bytes(keep)
                tmp.replace(path)
            except OSError as e:
                raise _failed("repair", path, e) from None
    return records


def make_directory(path: Path) -> Path:
    """`path` and its parents; a read-only or full disk is ResultsFileError naming it."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _failed("create", path, e) from None
    return Path(path)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise _failed("write", path, e) from None


def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")

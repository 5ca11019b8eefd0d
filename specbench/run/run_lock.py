"""One run per results directory: a non-blocking `flock` on `<dir>/run.lock`.

Two runs of the same settings would both pass the identity check, time on the same CPU at once and
append duplicate answers; the second is refused in one line naming the holder (pid, host, start time,
written into the lock file). The kernel drops the lock when its process ends, however it ends, so
a lock file left behind by a killed run blocks nothing: only a held lock does.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from specbench.errors import ResultsFileError, RunLockedError

LOCK_FILE = "run.lock"

# directory -> [fd, holders]: this process's locks; a second lock of the same directory by this
# process (a Hydra multirun's next job) shares the first, as flock would refuse a second open file
_HELD: dict[str, list[int]] = {}


class RunLock:
    """A held lock on one directory; `release()` (or the process's end) lets the next run in."""

    def __init__(self, key: str):
        self.key = key
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        held = _HELD.get(self.key)
        if held is None:
            return
        held[1] -= 1
        if held[1] <= 0:
            del _HELD[self.key]
            try:
                fcntl.flock(held[0], fcntl.LOCK_UN)
            finally:
                os.close(held[0])


def lock_run_directory(directory: Path) -> RunLock:
    """Take `directory`'s run lock without waiting; RunLockedError naming the holder if another
    process has it, ResultsFileError if the lock file cannot be created (a read-only folder)."""
    directory = Path(directory)
    key = str(directory.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        return RunLock(key)
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ResultsFileError(f"cannot create the run lock {path}: {e.strerror or e}; give a writable "
                               f"results_root=... or results_dir=...") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise RunLockedError(f"{directory} is in use by another run ({holder}); wait for it to finish, or "
                             f"give this run another results_dir=...") from None
    except OSError as e:  # a file system without locks
        os.close(fd)
        raise ResultsFileError(f"cannot lock {path}: {e.strerror or e}") from None
    try:
        note = (f"pid {os.getpid()} on {socket.gethostname()}, started "
                f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, note, 0)
    except OSError:
        pass  # the lock is what counts; the note only names the holder
    _HELD[key] = [fd, 1]
    return RunLock(key)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 400, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown: it has not written its name yet"

"""One timed run per device: a host-wide `flock` per device that timing holds alone.

Two jobs of a sweep on one machine would otherwise time while each other runs, and every speedup
they report would be an artefact. The lock is a reader-writer lock on one file per device (the CPU of
this host, or a GPU by its UUID) in a host-wide folder (`SPECBENCH_LOCK_DIR`, else
/tmp/specbench-locks):

- a run holds it shared from the moment it opens until it ends: loading, compiling, the lossless
  check's forwards and reporting run beside other runs' untimed work;
- each timed section (the warm-up, a quick cost curve, each timed generation) holds it exclusively,
  so it runs with no other run's work of any kind on the device, and waits, printing one line naming
  the holders, when another run has it.

A run that wants to time first lets go of its shared hold, then waits in line at a gate (a second
lock, held only while waiting): nobody holds one lock while waiting for the other in the other order,
so no two runs can deadlock, and a run that checks and times in turn cannot keep taking the device
ahead of one that waits. The kernel drops a dead process's locks, however it died; a holder's note
left behind by one is ignored.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from specbench.errors import ResultsFileError

# key -> [fd, users]: runs of one process (a Hydra multirun's jobs, a notebook) share one open file,
# as a second flock on another open file of the same process would wait for the first
_OPEN: dict[str, list] = {}


def lock_directory() -> Path:
    return Path(os.environ.get("SPECBENCH_LOCK_DIR") or "/tmp/specbench-locks")


def device_key(device: torch.device | str, gpu_uuid: str | None = None) -> str:
    """The lock's name: the CPU of this host, or one GPU by its UUID (its index where no UUID is known)."""
    device = torch.device(device)
    if device.type == "cuda":
        name = gpu_uuid or f"index{device.index if device.index is not None else torch.cuda.current_device()}"
        return "cuda-" + re.sub(r"[^\w.-]", "_", name)
    return f"{device.type}-" + re.sub(r"[^\w.-]", "_", socket.gethostname())


class DeviceLock:
    """The timing lock of one device for one run: `shared()` for the run's life, `exclusive()` around
    each timed section. `waits` and `waited` count how often and how long a timed section waited."""

    def __init__(self, key: str, run: str, directory: Path | None = None):
        self.key, self.run = key, run
        self.directory = Path(directory) if directory is not None else lock_directory()
        self.path = self.directory / f"{key}.lock"
        self.gate_path = self.directory / f"{key}.gate"
        self.notes = self.directory / f"{key}.holders"
        self.waits, self.waited, self._said, self._fd, self._gate = 0, 0.0, False, None, None

    def shared(self) -> "DeviceLock":
        held = str(self.path) in _OPEN  # this process holds it already (main.py's hold): shared at rest
        self._fd, self._gate = _open(self.path), _open(self.gate_path)
        if not held:  # waiting in line while holding it would block the run at the head of the line
            with self._in_line():
                self._take(self._fd, fcntl.LOCK_SH)
        self._note("loading or checking")
        return self

    @contextmanager
    def exclusive(self):
        waited = 0.0
        fcntl.flock(self._fd, fcntl.LOCK_UN)  # a run waiting in line must not hold up the one before it
        with self._in_line() as line:
            waited = line[0] + self._take(self._fd, fcntl.LOCK_EX)
        if waited > 0:
            self.waits += 1
            self.waited += waited
        self._note("timing")
        try:
            yield
        finally:
            self._note("loading or checking")
            fcntl.flock(self._fd, fcntl.LOCK_SH)  # from exclusive: never waits

    @contextmanager
    def let_go(self):
        """The shared hold given up while this run waits for something else (another job's AR answer
        under baseline=shared's file lock): a run that waits on another lock while holding this one
        could wait for a run that waits, in turn, for this one to let go."""
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        try:
            yield
        finally:
            with self._in_line():
                self._take(self._fd, fcntl.LOCK_SH)

    @contextmanager
    def _in_line(self):
        """The gate, a second lock held only while waiting for the first: whoever waits to time holds it,
        so a run that goes back and forth between checking and timing cannot take the device again ahead
        of it (flock alone would let it: its conversions never leave the lock free)."""
        line = [self._take(self._gate, fcntl.LOCK_EX)]
        try:
            yield line
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def release(self) -> None:
        if self._fd is None:
            return
        _drop(self.path, self._fd)
        _drop(self.gate_path, self._gate)
        self._fd = self._gate = None
        try:
            (self.notes / str(os.getpid())).unlink()
        except OSError:
            pass

    def _take(self, fd: int, mode: int) -> float:
        """`fd` locked in `mode`, at once if free; else one line naming the holders (once per run), then
        wait. Returns the seconds waited."""
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return 0.0
        except BlockingIOError:
            pass
        if not self._said:  # one line per run, not one per question
            self._said = True
            print(f"waiting for the timing lock of {self.key} ({self.path}): {holders_text(self.notes)}",
                  file=sys.stderr, flush=True)
        start = time.perf_counter()
        fcntl.flock(fd, mode)
        return time.perf_counter() - start

    def _note(self, state: str) -> None:
        """Who holds the lock and doing what, for the line a waiting run prints (best effort)."""
        try:
            self.notes.mkdir(parents=True, exist_ok=True)
            note = {"pid": os.getpid(), "host": socket.gethostname(), "run": self.run, "state": state,
                    "since": time.strftime("%H:%M:%S")}
            tmp = self.notes / f".{os.getpid()}.tmp"
            tmp.write_text(json.dumps(note))
            tmp.replace(self.notes / str(os.getpid()))
        except OSError:
            pass


def holders_text(notes: Path) -> str:
    """The live holders' notes as one phrase; a dead process's note is dropped."""
    parts = []
    for f in sorted(notes.glob("[0-9]*")) if notes.is_dir() else []:
        try:
            n = json.loads(f.read_text())
            if int(n["pid"]) == os.getpid():
                continue
            os.kill(int(n["pid"]), 0)
        except ProcessLookupError:
            f.unlink(missing_ok=True)
            continue
        except (OSError, ValueError, KeyError):
            continue
        parts.append(f"pid {n['pid']} on {n['host']} ({n['run']}) {n['state']} since {n['since']}")
    return "; ".join(parts) or "held by a run that has not named itself"


def _open(path: Path) -> int:
    key = str(path)
    if key in _OPEN:
        _OPEN[key][1] += 1
        return _OPEN[key][0]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(path.parent, 0o1777)  # every user of the host shares the device
        except OSError:
            pass
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise ResultsFileError(f"cannot open the timing lock {path}: {e.strerror or e}; set SPECBENCH_LOCK_DIR to "
                               "a writable folder on this host, or run with timing.exclusive=false") from None
    _OPEN[key] = [fd, 1]
    return fd


def _drop(path: Path, fd: int) -> None:
    held = _OPEN.get(str(path))
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _OPEN[str(path)]
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

"""Sweep support: an AR reference shared by every run with identical settings (baseline=shared).

With ``baseline=shared`` a method run takes its AR answers from the directory a ``method=ar`` run
with the same settings writes (``results/<model>/<task>/ar-t<T>-m<N>[-rR]/``). Questions that
directory lacks are generated there and appended, under a file lock, so parallel runs of a sweep
(e.g. SLURM jobs) neither duplicate nor lose an AR answer. AR then runs once per question for the
whole sweep instead of once per method.

Less drift-fair than ``baseline=interleave``: the AR answers may have been timed minutes or hours
before the method (another process, another machine state), so slow drift of the machine enters
the speedup. Use it to save time on big sweeps; use interleave for the figures you publish.
"""

from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable

from specbench.run.results_io import append_jsonl, read_jsonl, repair_jsonl, write_json_atomic
from specbench.errors import SettingsError


@contextmanager
def file_lock(path: Path, waiting=nullcontext):
    """An exclusive advisory lock (flock) held for the block; works across processes. `waiting`: the
    context the wait for it runs in (a run lets go of its device's timing lock there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        with waiting():
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class SharedBaseline:
    """AR answers kept in the shared ar-... directory; missing ones are made on demand."""

    def __init__(self, ar_dir: Path, identity: dict, cfg: dict, provenance: dict | None = None,
                 waiting=nullcontext):
        self.dir = Path(ar_dir)
        self.answers = self.dir / "answers.jsonl"
        self.lock = self.dir / ".shared.lock"
        # a job that holds the lock may be waiting to time its AR answer: wait for it without holding
        # the device (run/device_lock.py let_go), or the two wait for each other
        self.waiting = waiting
        self.dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.lock, waiting):
            cfg_file = self.dir / "run_config.json"
            if cfg_file.is_file():
                old = json.loads(cfg_file.read_text())["identity"]
                diff = {k: (old.get(k), v) for k, v in identity.items() if old.get(k) != v}
                if diff:
                    raise SettingsError(f"baseline=shared: {self.dir} holds AR answers made with other "
                                        f"settings {diff}; give another results_root=... or delete that directory")
            else:  # as a method=ar run would write it, so that run can later resume from here
                ar_cfg = dict(cfg, method={"name": "ar"}, baseline="none")
                write_json_atomic(cfg_file, {"identity": identity, "config": ar_cfg,
                                             "written_by": "baseline=shared",
                                             **({"provenance": provenance} if provenance else {})})
            repair_jsonl(self.answers)

    def load(self) -> dict:
        return {r["question_id"]: r for r in read_jsonl(self.answers)}

    def get_or_run(self, question_id, run: Callable[[], dict], stored: Callable[[dict], dict]) -> dict:
        """The AR record for a question: read from the shared file, or run and appended to it.

        The lock is held while AR runs, so two runs needing the same question never both make it.
        """
        with file_lock(self.lock, self.waiting):
            done = self.load()
            if question_id in done:
                return done[question_id]
            rec = run()
            rec["lossless"] = {"status": "exact"}  # AR is its own reference, as in a method=ar run
            append_jsonl(self.answers, stored(rec))
            return rec

"""Where a run's AR answers come from (the `baseline` setting): one strategy object per mode.

- interleave: AR on each question right before the method, in this process (fair against slow drift
  of the machine); its answers go to the run's baseline_answers.jsonl, so a resumed run keeps them;
- reuse: a finished `method=ar` run with identical settings, every question required up front;
- shared: the ar-... directory of identical settings, filled under a lock by whichever run of a sweep
  needs a question first (specbench/run/sweep.py);
- none: no AR answers, no speedup (and AR itself is its own baseline).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Callable

from specbench.run.provenance import differences, environment_key, provenance
from specbench.run.results_io import append_jsonl, read_json, read_jsonl, repair_jsonl
from specbench.errors import SettingsError


class Baseline:
    """No AR answers at all."""

    directory: Path | None = None  # where the AR answers live when another run made them

    def __init__(self):
        self.answers: dict = {}

    @property
    def active(self) -> bool:
        return False

    def answer(self, question_id, run_ar: Callable[[], dict], stored: Callable[[dict], dict]) -> dict | None:
        """AR's record for the question, running AR (`run_ar`) if this mode does and has none yet;
        `stored` is what goes to disk of a record."""
        return self.answers.get(question_id)


class Interleaved(Baseline):
    def __init__(self, path: Path):
        self.path = path
        self.answers = {r["question_id"]: r for r in repair_jsonl(path)}

    @property
    def active(self) -> bool:
        return True

    def answer(self, question_id, run_ar, stored):
        if question_id not in self.answers:
            record = run_ar()
            append_jsonl(self.path, stored(record))
            self.answers[question_id] = record
        return self.answers[question_id]


class Reused(Baseline):
    def __init__(self, ar_dir: Path, question_ids: list):
        self.directory = ar_dir
        self.answers = {r["question_id"]: r for r in repair_jsonl(ar_dir / "answers.jsonl")}
        missing = [q for q in question_ids if q not in self.answers]
        if missing:
            raise SettingsError(
                f"baseline=reuse: {ar_dir} lacks AR answers for {len(missing)} question(s) "
                f"(e.g. {missing[0]}); run method=ar with the same settings first, or use baseline=interleave")

    @property
    def active(self) -> bool:
        return True


class Shared(Baseline):
    def __init__(self, ar_dir: Path, ar_identity: dict, cfg: dict, provenance: dict | None = None,
                 waiting=nullcontext):
        from specbench.run.sweep import SharedBaseline

        self.directory = ar_dir
        self.shared = SharedBaseline(ar_dir, ar_identity, cfg, provenance, waiting)
        self.answers = self.shared.load()

    @property
    def active(self) -> bool:
        return True

    def answer(self, question_id, run_ar, stored):
        if question_id not in self.answers:
            self.answers[question_id] = self.shared.get_or_run(question_id, run_ar, stored)
        return self.answers[question_id]


def check_baseline_environment(mode: str, ar_dir: Path, device=None, here: dict | None = None) -> None:
    """Refuse AR answers in `ar_dir` (baseline=shared or reuse) timed on other hardware or software than
    `here` (default: this machine's provenance on `device`, run/provenance.py): a speedup over them
    measures two machines."""
    here = provenance(device) if here is None else here
    theirs = {}
    cfg_file = ar_dir / "run_config.json"
    if cfg_file.is_file():
        theirs = read_json(cfg_file).get("provenance") or {}
    diff = differences(theirs, here) if theirs else {}
    mine = environment_key(here)
    keys = {(r.get("timing") or {}).get("environment") for r in read_jsonl(ar_dir / "answers.jsonl")} - {None}
    if not diff and keys - {mine}:
        diff = {"timing environment": (sorted(keys - {mine}), mine)}
    if diff:
        detail = ", ".join(f"{k} {a!r} there, {b!r} here" for k, (a, b) in diff.items())
        raise SettingsError(f"baseline={mode}: the AR answers in {ar_dir} were timed on other hardware or software "
                            f"({detail}); use baseline=interleave, another results_root=..., or "
                            "timing.allow_mixed=true (its speedups are then marked in every table)")

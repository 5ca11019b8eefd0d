"""What every timed section of a run goes through: the device's timing lock held alone
(run/device_lock.py), the device's other load sampled around it (run/contention.py), and the
provenance of the timing (run/provenance.py) stamped on what it timed."""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

from specbench.config import RunPlan
from specbench.run.metrics import plain_step_ratio
from specbench.run.contention import LoadSampler
from specbench.run.device_lock import DeviceLock, device_key
from specbench.run.provenance import environment_key, provenance


class TimingGuard:
    """Holds the device's timing lock shared from its making to `release()`; `timed()` around each
    timed section holds it exclusively and yields a dict that holds, once the section ends, the
    load the device had meanwhile (`contended` among it), whether timing was exclusive, and the
    timing environment's key."""

    def __init__(self, plan: RunPlan):
        cfg = plan.settings
        self.exclusive = bool(cfg.timing.exclusive)
        self.provenance = provenance(cfg.device)
        self.environment = environment_key(self.provenance)
        self.lock = hold_device(plan, self.provenance)
        self.sampler = LoadSampler(cfg.device, cfg.timing.max_other_load, self.provenance.get("gpu_uuid"))

    @contextmanager
    def timed(self):
        sample: dict = {}
        with self.lock.exclusive() if self.lock else nullcontext():
            started = self.sampler.start()
            yield sample
            sample.update(self.sampler.stop(started), exclusive=self.exclusive, environment=self.environment)

    def waiting(self):
        """A context in which this run waits for another lock without holding the device's
        (device_lock.DeviceLock.let_go)."""
        return self.lock.let_go() if self.lock else nullcontext()

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def summary(self, records: list[dict], baseline: list[dict]) -> dict:
        """The run's timing conditions: how its timed generations fared, the lock's waits, provenance."""
        return {
            "exclusive": self.exclusive, "lock": self.lock.key if self.lock else None,
            "waits": self.lock.waits if self.lock else 0,
            "waited_s": round(self.lock.waited, 3) if self.lock else 0.0,
            "max_other_load": self.sampler.max_other_load,
            "contended": contended_count(records), "baseline_contended": contended_count(baseline),
            # the method's one-row steps against AR's at the same contexts: about 1 when both met one machine
            "plain_step_ratio": dict(zip(("ratio", "steps"), plain_step_ratio(records, baseline))),
            "provenance": dict(self.provenance, ended=time.strftime("%Y-%m-%dT%H:%M:%S%z")),
        }


def contended_count(records: list[dict]) -> int:
    return sum(1 for r in records if (r.get("timing") or {}).get("contended"))


def hold_device(plan: RunPlan, prov: dict) -> DeviceLock | None:
    """The run's device's timing lock (by `prov`'s GPU UUID on CUDA), held shared; None with
    timing.exclusive=false. Runs of one process share one (device_lock._OPEN)."""
    cfg = plan.settings
    if not cfg.timing.exclusive:
        return None
    return DeviceLock(device_key(cfg.device, prov.get("gpu_uuid")), plan.results_dir).shared()

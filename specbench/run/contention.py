"""The device's other load while a generation is timed, so a contaminated timing is flagged, not trusted.

On a CPU: the CPU time every other process used (from /proc/stat, less this process's own) per wall
second, in cores, and the time the hypervisor stole. The run's threads ask for `threads` cores; other
load that fits in the cores they leave free costs the timing nothing, so the generation is flagged as
contended when other load plus steal exceeds the free cores by more than `max_other_load`. On a GPU:
any other process computing on it (NVML, through pynvml where installed), and the host's CPU load as
above with one core asked for (the step's host thread).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CpuCounters:
    wall: float  # seconds
    busy: float | None  # CPU seconds every process used, summed over the cores (None: no /proc/stat)
    steal: float | None  # CPU seconds the hypervisor took
    own: float  # CPU seconds of this process, all its threads


def read_cpu_counters(stat_path: str = "/proc/stat") -> CpuCounters:
    own, wall = time.process_time(), time.perf_counter()
    try:
        with open(stat_path) as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return CpuCounters(wall, None, None, own)
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0.0] * 8)[:8]
    return CpuCounters(wall, (user + nice + system + irq + softirq) / hz, steal / hz, own)


def cpu_load(before: CpuCounters, after: CpuCounters, cores: int, asked: int) -> dict:
    """Other processes' and this one's CPU use between two readings, in cores."""
    wall = max(after.wall - before.wall, 1e-9)
    own = (after.own - before.own) / wall
    out = {"own_cores": round(own, 3), "cores": cores, "free_cores": max(cores - asked, 0),
           "other_cores": None, "steal_cores": None}
    if before.busy is not None and after.busy is not None:
        out["other_cores"] = round(max((after.busy - before.busy) / wall - own, 0.0), 3)
        out["steal_cores"] = round(max((after.steal - before.steal) / wall, 0.0), 3)
    return out


def is_contended(load: dict, max_other_load: float) -> bool:
    """Other load beyond what the run leaves free, by more than `max_other_load` cores; or another
    process on the GPU. Unknown load is not flagged (it is recorded as unknown)."""
    if load.get("gpu_other_processes"):
        return True
    if load.get("other_cores") is None:
        return False
    return load["other_cores"] + (load.get("steal_cores") or 0.0) > load["free_cores"] + max_other_load


def gpu_other_processes(uuid: str | None) -> int | None:
    """How many other processes compute on the GPU with this UUID now (None: NVML unavailable)."""
    if not uuid:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception:  # noqa: BLE001 - no pynvml, no driver access: the load stays unknown
        return None
    return len(pids - {os.getpid()})


class LoadSampler:
    """Samples the device's other load around one timed generation (`start`, then `stop`)."""

    def __init__(self, device: torch.device | str, max_other_load: float, gpu_uuid: str | None = None):
        self.device = torch.device(device)
        self.max_other_load = max_other_load
        self.gpu_uuid = gpu_uuid
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def start(self) -> tuple:
        return read_cpu_counters(), self._gpu_others(), time.time()

    def stop(self, started: tuple) -> dict:
        """The load meanwhile, and when the section ran (epoch seconds: two runs' sections can be
        checked for overlap)."""
        before, others_before, since = started
        asked = 1 if self.device.type == "cuda" else torch.get_num_threads()
        load = cpu_load(before, read_cpu_counters(), self.cores, asked)
        load["started"], load["ended"] = round(since, 3), round(time.time(), 3)
        if self.device.type == "cuda":
            others = [n for n in (others_before, self._gpu_others()) if n is not None]
            load["gpu_other_processes"] = max(others) if others else None
        load["contended"] = is_contended(load, self.max_other_load)
        return load

    def _gpu_others(self) -> int | None:
        return gpu_other_processes(self.gpu_uuid) if self.device.type == "cuda" else None

"""Where, on what and with what a run timed: the host, its CPU, the GPU, the libraries, when.

A speedup is a ratio of two timings; it means something only when both were timed on the same
hardware and software. `environment` is the part of the provenance that decides a timing (the host's
name is not part of it: two nodes of one kind time alike); a method's records and its baseline's
carry its short key, and `mixed` compares them.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import time

import torch

# what decides a timing: a method and its baseline timed with any of these different are not comparable
ENVIRONMENT_KEYS = ("cpu_model", "cores", "gpu_name", "torch", "transformers")


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_facts(device: torch.device) -> dict:
    """The GPU's name, UUID and driver; empty for a CPU run."""
    if device.type != "cuda":
        return {}
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    facts = {"gpu_name": props.name, "gpu_uuid": str(getattr(props, "uuid", "")) or None,
             "cuda": torch.version.cuda}
    try:  # the driver is NVML's to tell; without pynvml it stays unknown
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        facts["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:  # noqa: BLE001 - provenance is best effort beyond torch's own facts
        facts["driver"] = None
    return facts


def provenance(device: torch.device | str) -> dict:
    """This process's timing provenance, with the time it was taken as `started`."""
    import transformers

    device = torch.device(device)
    return {
        "host": socket.gethostname(), "cpu_model": cpu_model(), "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": torch.get_num_threads(), "gpu_name": None, **gpu_facts(device),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def environment(prov: dict) -> dict:
    return {k: prov.get(k) for k in ENVIRONMENT_KEYS}


def environment_key(prov: dict) -> str:
    """A short hash of what decides a timing, carried by every timed record."""
    text = json.dumps(environment(prov), sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def differences(a: dict, b: dict) -> dict:
    """{key: (a's, b's)} for the environment keys where two provenances differ."""
    return {k: (a.get(k), b.get(k)) for k in ENVIRONMENT_KEYS if a.get(k) != b.get(k)}

"""Wall-clock timing that waits for the device, so asynchronous GPU work is counted; the device's name
as results record it."""

from __future__ import annotations

import platform
import time

import torch


def synchronize(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def now(device: torch.device | str) -> float:
    synchronize(device)
    return time.perf_counter()


def device_name(device: torch.device | str) -> str:
    """The same label the runner writes in summaries ('cuda' gets the GPU's name)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return (platform.processor() or platform.machine()) + f" ({torch.get_num_threads()} threads)"

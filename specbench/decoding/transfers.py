"""Moving small tensors between host and device without stalling the step.

On CUDA a copy from pageable host memory, and every read of a device value on the host (`tolist`,
`item`, `int(t)`, a boolean mask index), waits for the device to finish all queued work: a stream
synchronisation. A decoding step affords one (the accepted path coming back, engine.py); every
other transfer goes through these two helpers, which a `SyncAudit` (sync_audit.py) recognises:

* `to_device`: host data to the device through pinned memory, asynchronously (the copy is queued
  behind the step's kernels; the host goes on);
* `HostCopy`: a device tensor's copy to the host, started now and read later with `wait()`, which
  on CUDA waits on an event recorded after the copy (usually long done by then).

`on_host` says when a CPU-only path (numpy over the tensors' memory) may run instead.
"""

from __future__ import annotations

import torch


# Set while a SyncAudit has the CPU stand in for an accelerator: the accelerator's code path runs then.
_STANDING_IN = False


def on_host(device) -> bool:
    """Whether tensors on `device` are host memory that numpy may read at no cost (a CPU), so that
    a CPU-only path may replace torch's small operations; false while a SyncAudit audits the CPU."""
    return torch.device(device).type == "cpu" and not _STANDING_IN


def on_host_now() -> bool:
    """`on_host` for a device already found to be a CPU: false only while a SyncAudit audits the CPU (a
    device check, as `on_host` makes, costs microseconds a step)."""
    return not _STANDING_IN


def to_device(data, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`data` (a list or a host tensor) on `device`; on CUDA an asynchronous copy from pinned memory."""
    device = torch.device(device)
    if isinstance(data, torch.Tensor) and data.device == device and device.type != "cpu":
        return data if dtype is None else data.to(dtype)  # already there (on the CPU: a no-op `to` below)
    host = torch.as_tensor(data, dtype=dtype)
    if device.type == "cuda" and host.device.type == "cpu":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def stacked_to_device(parts: list[torch.Tensor], device) -> list[torch.Tensor]:
    """Several small host tensors on `device` in one queued copy (as int64, then each its own dtype)."""
    flat = to_device(torch.cat([p.reshape(-1).to(torch.long) for p in parts]), device)
    out, at = [], 0
    for p in parts:
        out.append(flat[at : at + p.numel()].reshape(p.shape).to(p.dtype))
        at += p.numel()
    return out


class HostCopy:
    """A device tensor's copy on the host, started without waiting; read it through `wait()`."""

    def __init__(self, tensor: torch.Tensor, host: bool = False):
        """`host`: the caller knows `tensor` is host memory already (`on_host`): kept as it is, without
        the copy's or the device check's microseconds."""
        self._host = tensor if host else tensor.to("cpu", non_blocking=True)
        self._list: list | None = None
        self._event = None
        if not host and tensor.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self) -> torch.Tensor:
        """The host tensor, once the copy has arrived (a no-op off CUDA, and once the event is done)."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._host

    def tolist(self) -> list:
        """The copy as a list, made once (the copy does not change; TR's drafters read a template's tokens
        in two steps)."""
        if self._list is None:
            self._list = self.wait().tolist()
        return self._list

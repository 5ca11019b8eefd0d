"""Which host-device synchronisations a decoding step makes, counted on any machine, the CPU included.

On CUDA each one stalls the host until the device's queue drains: a read of a device value on the
host (`tolist`, `item`, ...), an operation whose output size depends on device values (`nonzero`,
a boolean mask index, ...), a blocking copy of host data to the device. `SyncAudit` follows where
every tensor would live (parameters, buffers and whatever is made from them or with a `device=` are
on the device) and counts all three kinds, where `torch.cuda.set_sync_debug_mode` sees the first two
on a GPU only. transfers.py's asynchronous helpers are free; reading a `HostCopy` before anything
synchronised is an error. The full rules: docs/gpu-readiness.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

from specbench.decoding import transfers

HOST_READS = {"tolist", "item", "__int__", "__bool__", "__float__", "__index__", "numpy", "__array__", "cpu"}
DATA_DEPENDENT = {"nonzero", "unique", "unique_consecutive", "masked_select", "argwhere", "nonzero_static"}
FACTORIES = {"tensor", "as_tensor", "full", "zeros", "ones", "empty", "arange", "rand", "randn", "randint",
             "linspace", "eye", "scalar_tensor"}
COPIES_DATA = {"tensor", "as_tensor"}  # factories that copy host data to the device when given one


@dataclass
class Event:
    kind: str  # sync (stalls the host on CUDA), async (a queued copy), early-read (an error)
    what: str  # the operation and the direction
    step: int


class SyncAudit(TorchFunctionMode):
    """`with SyncAudit(model) as audit: ...`; `audit.step = n` labels what follows; `audit.syncs(n)`."""

    def __init__(self, *modules: torch.nn.Module):
        super().__init__()
        self.events, self.step = [], -1
        self._device = WeakTensorKeyDictionary()
        self._in_flight = WeakTensorKeyDictionary()
        for m in modules:
            for t in [*m.parameters(), *m.buffers()]:
                self._device[t] = True

    # -- what the tests read ------------------------------------------------------------------
    def syncs(self, step: int) -> list[str]:
        return [e.what for e in self.events if e.step == step and e.kind == "sync"]

    def early_reads(self) -> list[str]:
        return [f"step {e.step}: {e.what}" for e in self.events if e.kind == "early-read"]

    def summary(self, step: int) -> Counter:
        return Counter(f"{e.kind}: {e.what}" for e in self.events if e.step == step)

    def on_device(self, t: torch.Tensor) -> bool:
        return t in self._device

    def mark(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            self._device[t] = True

    # -- bookkeeping ----------------------------------------------------------------------------
    def _record(self, kind: str, what: str) -> None:
        self.events.append(Event(kind, what, self.step))
        if kind == "sync":  # the stream has drained: every queued copy has arrived
            self._in_flight = WeakTensorKeyDictionary()

    def _set(self, out, on_device: bool, in_flight: bool = False) -> None:
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                if on_device:
                    self._device[t] = True
                elif t in self._device:
                    del self._device[t]
                if in_flight:
                    self._in_flight[t] = True

    def __enter__(self):
        audit = self
        self._wait = transfers.HostCopy.wait
        self._standing_in, transfers._STANDING_IN = transfers._STANDING_IN, True  # no CPU-only paths

        def wait(copy):  # waiting on a copy still under way is a (partial) synchronisation
            if copy._host in audit._in_flight:
                audit._record("sync", "HostCopy.wait (copy still under way)")
            return audit._wait(copy)

        transfers.HostCopy.wait = wait
        return super().__enter__()

    def __exit__(self, *exc):
        transfers.HostCopy.wait = self._wait
        transfers._STANDING_IN = self._standing_in
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if name not in ("__get__", "__set__") and any(t in self._in_flight for t in leaves):
            self._record("early-read", f"{name} of a host copy that may not have arrived")
        dev_in = any(t in self._device for t in leaves)
        out = func(*args, **kwargs)
        if name in ("__set__", "__len__", "dim", "size", "numel", "is_floating_point"):
            return out
        if name == "__get__":  # a property: `.T`, `.data`, `.shape`, ... (tensors stay where they were)
            self._set(out, dev_in)
            return out
        this = args[0] if args and isinstance(args[0], torch.Tensor) else None
        self_on_device = this is not None and this in self._device

        if name in FACTORIES:
            device = kwargs.get("device")
            to_device = device is not None and device != "cpu"
            data = args[0] if args else kwargs.get("data")
            if to_device and name in COPIES_DATA and not (isinstance(data, torch.Tensor) and data in self._device):
                self._record("sync", f"torch.{name}(host data, device=)")
            self._set(out, to_device or (name in COPIES_DATA and dev_in and device is None))
        elif name in HOST_READS:
            if self_on_device:
                self._record("sync", f"Tensor.{name} of a device tensor")
            if out is this:  # `.cpu()` of a CPU tensor is the tensor itself: keep the two apart
                out = out.clone()
            self._set(out, False)
        elif name == "to":
            if out is this and self._moves(args, kwargs, self_on_device):  # here a no-op; on CUDA a copy
                out = out.clone()
            self._to(args, kwargs, out, self_on_device)
        elif name in ("copy_", "__setitem__", "index_put_", "index_copy_"):
            self._write(name, args, self_on_device)
        elif name in DATA_DEPENDENT and dev_in:
            self._record("sync", f"{name} on the device (output size read back)")
            self._set(out, True)
        elif name == "__getitem__" and self_on_device:
            self._index(args[1], "__getitem__")
            self._set(out, True)
        else:
            host = [t for t in leaves if t not in self._device and t.dim() > 0]
            if dev_in and host:  # on CUDA an error or an implicit copy: count the copy
                self._record("sync", f"{name} with a host tensor operand")
            self._set(out, dev_in)
        return out

    @staticmethod
    def _target(args, kwargs):
        """(the device asked for, or None; whether it is the host; non_blocking)."""
        device, _, non_blocking, *_ = torch._C._nn._parse_to(*args[1:], **kwargs)
        target = args[1] if len(args) > 1 and not isinstance(args[1], torch.dtype) else kwargs.get("device")
        return device, target == "cpu", non_blocking

    def _moves(self, args, kwargs, self_on_device: bool) -> bool:
        device, to_host, _ = self._target(args, kwargs)
        return device is not None and to_host == self_on_device

    def _to(self, args, kwargs, out, self_on_device: bool) -> None:
        device, to_host, non_blocking = self._target(args, kwargs)
        if device is None:  # a dtype change stays where it is
            self._set(out, self_on_device)
        elif to_host:
            if self_on_device:
                self._record("async" if non_blocking else "sync", "copy to the host")
            self._set(out, False, in_flight=self_on_device and non_blocking)
        else:
            if not self_on_device:
                self._record("async" if non_blocking else "sync", "copy to the device")
            self._set(out, True)

    def _write(self, name: str, args, dst_on_device: bool) -> None:
        operands = [t for t in tree_leaves(args[1:]) if isinstance(t, torch.Tensor)]
        if dst_on_device:
            if name == "__setitem__":
                self._index(args[1], name)
                operands = [args[2]] if isinstance(args[2], torch.Tensor) else []
                # a Python number under a tensor index becomes a 0-dim host tensor that index_put_
                # copies to the device, blocking (seen on an H200: TR's `written[tokens] = True`)
                if not operands and any(isinstance(t, torch.Tensor) and t.dim() > 0 for t in tree_leaves(args[1])):
                    self._record("sync", f"{name} of a Python number under a tensor index")
            if any(t not in self._device and t.dim() > 0 for t in operands):
                self._record("sync", f"{name} of host data into a device tensor")
        elif any(t in self._device for t in operands):
            self._record("sync", f"{name} of device data into a host tensor")

    def _index(self, index, name: str) -> None:
        for t in tree_leaves(index):
            if not isinstance(t, torch.Tensor):
                continue
            if t in self._device and t.dtype == torch.bool:
                self._record("sync", f"{name} with a boolean mask (output size read back)")
            elif t not in self._device and t.dim() > 0:
                self._record("sync", f"{name} with a host index into a device tensor")

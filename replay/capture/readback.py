"""Device values brought to the host without making anyone wait: one copy a step, read when ready.

The recorder needs a few scalars of each step on the host (the loss, the gradient norm before
any clip, the non-finite flags, the ranks' stop votes). Reading each with ``.item()`` or
``.cpu()`` waits for everything the training thread has queued on the device: a host-device
synchronisation per read. Instead :meth:`Readback.launch` writes a step's scalars into one
reused float64 buffer on their device (``copy_`` into its 0-dim cells, which casts), copies it
with ``non_blocking=True`` into a reused host buffer (page-locked on a GPU) and records a CUDA
event after the copy. :meth:`Ticket.ready` asks the event (``query()``, which never waits);
:meth:`Ticket.values` then reads the buffer through a numpy view made when it was allocated:
plain host memory, no tensor call.

On the CPU the same code runs: the buffer on the values' device *is* the host buffer, so the
copy to the host is a copy of a tensor onto itself (torch returns at once), there is no event,
and a ticket is ready at once: a CPU run reads its values in the same step. The only branch on
the device is where the buffers and the event are made (:class:`_Slot`). Nothing is allocated
per launch: a step's few values cost a few ``copy_`` calls (the first version stacked them
into a new tensor and cast it, several times a step: +110-210 us a CPU step, RESULTS.md).

The buffers form a ring per device: a slot is reused only once its ticket was read (or found
ready), so a copy still in flight is never overwritten; when every slot is in flight (the
training thread far ahead of the device) the ring grows by one slot.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["Readback", "Ticket", "value_now"]


class _Slot:
    """One reused host buffer of ``size`` float64 values (pinned for a CUDA source) and its
    numpy view; the buffer on the source device the values are gathered in (the host buffer
    itself for a host source) and its 0-dim cells; the event its last copy recorded."""

    __slots__ = ("host", "view", "stage", "cells", "event", "busy")

    def __init__(self, size: int, device: torch.device) -> None:
        on_gpu = device.type == "cuda"
        self.host = torch.empty(size, dtype=torch.float64, pin_memory=on_gpu)
        self.view: np.ndarray = self.host.numpy()  # (once, here: reading it is host memory)
        on_host = device.type == "cpu"
        self.stage = self.host if on_host else torch.empty(size, dtype=torch.float64, device=device)
        self.cells = self.stage.unbind()  # 0-dim views: a value is one copy_ into its cell
        self.event = torch.cuda.Event() if on_gpu else None  # type: ignore[no-untyped-call]  # torch stubs
        self.busy = False

    def fill(self, tensors: Sequence[torch.Tensor]) -> None:
        """Each tensor's first element into a cell (cast to float64), then :meth:`send`."""
        for cell, t in zip(self.cells, tensors):
            cell.copy_(_first(t))
        self.send()

    def send(self) -> None:
        """The one non-blocking copy to the host (onto itself on the CPU), then the event."""
        self.busy = True
        self.host.copy_(self.stage, non_blocking=True)
        if self.event is not None:
            self.event.record()


class Ticket:
    """A launched copy: ``ready()`` without waiting, then ``values()`` (python floats)."""

    __slots__ = ("_parts", "_n", "_values")

    def __init__(self, parts: list[tuple[_Slot, list[int] | None]], n: int) -> None:
        self._parts = parts  # (slot, the positions its values go to; None: 0..n-1, one slot)
        self._n = n
        self._values: list[float] | None = None if parts else []

    def ready(self) -> bool:
        """Whether every copy is done (asks the events; never waits)."""
        if self._values is not None:
            return True
        for slot, _ in self._parts:
            if slot.event is not None and not slot.event.query():  # type: ignore[no-untyped-call]  # torch stubs
                return False
        self._read()
        return True

    def wait(self) -> None:
        """Wait for the copies (only where a wait is the point: flush, close, a step that
        raised, a verdict the ranks must all read at the same step)."""
        if self._values is None:
            for slot, _ in self._parts:
                if slot.event is not None:
                    slot.event.synchronize()
            self._read()

    def _read(self) -> None:
        parts = self._parts
        if len(parts) == 1 and parts[0][1] is None:
            out = parts[0][0].view.tolist()[: self._n]
        else:
            out = [math.nan] * self._n
            for slot, where in parts:
                got = slot.view.tolist()
                for j, i in enumerate(where or range(self._n)):
                    out[i] = got[j]
        for slot, _ in parts:
            slot.busy = False  # read: the slot may take the next copy
        self._values = out

    def values(self) -> list[float]:
        """The values in the order launched (call once ``ready()`` or ``wait()``)."""
        if self._values is None:
            raise RuntimeError("Ticket.values() before the copy is ready")
        return self._values


class Readback:
    """Rings of host buffers, one per source device (see the module docstring)."""

    def __init__(self, size: int = 16) -> None:
        self.size = size  # values per slot; a launch of more takes several slots
        self._rings: dict[torch.device, list[_Slot]] = {}

    def _slot(self, device: torch.device, n: int) -> _Slot:
        ring = self._rings.setdefault(device, [])
        for slot in ring:
            if not slot.busy and slot.view.size >= n:
                return slot
        slot = _Slot(max(n, self.size), device)
        ring.append(slot)
        return slot

    def launch(self, tensors: Sequence[torch.Tensor]) -> Ticket:
        """Copy the first element of each tensor to the host, one copy per device."""
        n = len(tensors)
        if not n:
            return Ticket([], 0)
        device = tensors[0].device
        if n <= self.size:
            for t in tensors:
                if t.device != device:
                    break
            else:  # the usual launch: one device, one slot
                slot = self._slot(device, n)
                slot.fill(tensors)
                return Ticket([(slot, None)], n)
        groups: dict[torch.device, list[int]] = {}
        for i, t in enumerate(tensors):
            groups.setdefault(t.device, []).append(i)
        parts: list[tuple[_Slot, list[int] | None]] = []
        for device, where in groups.items():
            for k in range(0, len(where), self.size):
                chunk = where[k : k + self.size]
                slot = self._slot(device, len(chunk))
                slot.fill([tensors[i] for i in chunk])
                parts.append((slot, chunk))
        return Ticket(parts, n)

    def launch_whole(self, t: torch.Tensor) -> Ticket:
        """Copy every element of ``t`` (a few: the ranks' votes) to the host, as float64."""
        n = t.numel()
        slot = self._slot(t.device, n)
        slot.stage[:n].copy_(t.detach().reshape(-1))
        slot.send()
        return Ticket([(slot, list(range(n)))], n)


def _first(t: torch.Tensor) -> torch.Tensor:
    """``t``'s first element (a 0-dim tensor, no autograd), NaN for an empty one."""
    if t.requires_grad:  # (a loss: copied with its graph, the buffer would join it)
        t = t.detach()
    if t.ndim:
        return t.reshape(-1)[0] if t.numel() else torch.full((), math.nan, device=t.device)
    return t


class _Last:
    """A thread's one-value buffer, and the last two tensors read through it (``value_now``)."""

    __slots__ = ("slot", "seen")

    def __init__(self) -> None:
        self.slot = _Slot(1, torch.device("cpu"))
        self.seen: list[tuple[torch.Tensor, int, float]] = []  # (tensor, version, value)


_now = threading.local()  # each thread its own


def value_now(t: torch.Tensor) -> float | None:
    """``t``'s value when it can be had without waiting for a device: a host tensor's, through
    a reused host buffer (one ``copy_``, no tensor read); ``None`` for a tensor on a device (no
    copy is launched: its value comes with the step's :class:`Readback`, later).

    The values of the last two tensors asked for are kept while their versions (bumped by any
    in-place change) stay: a step asks for its gradient norm and its loss twice each
    (``exact_if_needed``, the recorder's ``_looks_bad``, then its health row,
    ``InFlight.launch``). A tensor that requires grad (a loss) is not kept: that would keep its
    graph. (Not ``item()``, though 8x cheaper: the suite proves the GPU route reads nothing back
    by counting the tensor reads a CPU run makes, test_no_readback_on_training_thread.)
    """
    if not t.is_cpu:
        return None
    last: _Last | None = getattr(_now, "last", None)
    if last is None:
        last = _now.last = _Last()
    for seen, version, value in last.seen:
        if seen is t and version == t._version:
            return value
    slot = last.slot
    slot.cells[0].copy_(_first(t))
    value = float(slot.view.item(0))
    if not t.requires_grad:
        last.seen = [(t, t._version, value), *last.seen[:1]]
    return value

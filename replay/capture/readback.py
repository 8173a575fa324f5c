"""Device values brought to the host without making anyone wait: one copy a step, read when ready.

The recorder needs a few scalars of each step on the host (the loss, the gradient norm before
any clip, the non-finite flags, the ranks' stop votes). Reading each with ``.item()`` or
``.cpu()`` waits for everything the training thread has queued on the device: a host-device
synchronisation per read. Instead :meth:`Readback.launch` gathers a step's scalars into one
float64 tensor on their device, copies it with ``non_blocking=True`` into a reused host buffer
(page-locked on a GPU) and records a CUDA event after the copy. :meth:`Ticket.ready` asks the
event (``query()``, which never waits); :meth:`Ticket.values` then reads the buffer through a
numpy view made when it was allocated: plain host memory, no tensor call.

On the CPU the same code runs: the "copy" is done when ``launch`` returns and there is no event,
so a ticket is ready at once and a CPU run reads its values in the same step. The only branch on
the device is where a buffer and an event are made (:class:`_Slot`).

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
    """One reused host buffer of ``size`` float64 values (pinned for a CUDA source), its numpy
    view, and the event its last copy recorded."""

    __slots__ = ("host", "view", "event", "busy")

    def __init__(self, size: int, device: torch.device) -> None:
        on_gpu = device.type == "cuda"
        self.host = torch.empty(size, dtype=torch.float64, pin_memory=on_gpu)
        self.view: np.ndarray = self.host.numpy()  # (once, here: reading it is host memory)
        self.event = torch.cuda.Event() if on_gpu else None  # type: ignore[no-untyped-call]  # torch stubs
        self.busy = False


class Ticket:
    """A launched copy: ``ready()`` without waiting, then ``values()`` (python floats)."""

    __slots__ = ("_parts", "_n", "_values")

    def __init__(self, parts: list[tuple[_Slot, list[int]]], n: int) -> None:
        self._parts = parts  # (slot, the positions its values go to)
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
        out = [math.nan] * self._n
        for slot, where in self._parts:
            view = slot.view
            for j, i in enumerate(where):
                out[i] = float(view[j])
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
        groups: dict[torch.device, list[int]] = {}
        for i, t in enumerate(tensors):
            groups.setdefault(t.device, []).append(i)
        parts: list[tuple[_Slot, list[int]]] = []
        with torch.no_grad():
            for device, where in groups.items():
                for k in range(0, len(where), self.size):
                    chunk = where[k : k + self.size]
                    flat = torch.stack([_scalar(tensors[i]) for i in chunk])
                    slot = self._slot(device, len(chunk))
                    slot.busy = True
                    slot.host[: len(chunk)].copy_(flat, non_blocking=True)
                    if slot.event is not None:
                        slot.event.record()
                    parts.append((slot, chunk))
        return Ticket(parts, len(tensors))

    def launch_whole(self, t: torch.Tensor) -> Ticket:
        """Copy every element of ``t`` (a few: the ranks' votes) to the host, as float64."""
        n = t.numel()
        slot = self._slot(t.device, n)
        slot.busy = True
        with torch.no_grad():
            slot.host[:n].copy_(t.detach().reshape(-1).to(torch.float64), non_blocking=True)
        if slot.event is not None:
            slot.event.record()
        return Ticket([(slot, list(range(n)))], n)


def _scalar(t: torch.Tensor) -> torch.Tensor:
    """``t``'s first element as a 0-dim float64 tensor on its device (NaN for an empty one)."""
    t = t.detach()
    if t.dim():
        t = t.reshape(-1)[0] if t.numel() else torch.full((), math.nan, device=t.device)
    return t if t.dtype == torch.float64 else t.to(torch.float64)


_now = threading.local()  # each thread its own one-value ring


def value_now(t: torch.Tensor) -> float | None:
    """``t``'s value when it can be had without waiting for a device: a host tensor's, through
    a reused host buffer; ``None`` for a tensor on a device (no copy is launched: its value
    comes with the step's :class:`Readback`, later)."""
    if t.device.type != "cpu":
        return None
    ring = getattr(_now, "ring", None)
    if ring is None:
        ring = _now.ring = Readback(size=1)
    ticket = ring.launch([t])
    ticket.ready()
    return ticket.values()[0]

"""Steps whose health is still on its way from the device, in step order.

When a step returns, the recorder launches one copy of its health tensors (the loss, the
gradient norm before any clip, the flags' maxima, the scaler's scale, a DDP rank's own norm)
through a :class:`~replay.capture.readback.Readback`: one non-blocking copy into a reused host
buffer, an event after it. The step waits here, its record complete but for those values, until
the event says the copy is done; only then is its health row built from host floats and the
step published to the step log or handed to the writer thread, which so never waits for the
device. A CPU step's copy is done at once: it is settled before ``Recorder.step`` returns, as
before. A GPU step's is normally settled at the next step or a few steps later (``ready``); a
flush, close or a step that raised waits for them all (``drain``).

A batch copied from the device carries its own event (``StepJob.event``): it must be done too
before the step goes to the writer thread.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import torch

from ..capture.readback import Readback, Ticket
from ..capture.tensors import CopyStats
from ..store.contracts import StepException
from .writer_thread import StepJob

__all__ = ["InFlight", "Settled"]


@dataclass(slots=True)
class Settled:
    """A step whose health is now host floats (``health``; ``loss``: the loss's value, or
    ``None`` when the step returned none)."""

    step: int
    job: StepJob
    direct: bool
    health: dict[str, Any]
    copied: CopyStats
    exception: StepException | None
    loss: float | None


@dataclass(slots=True)
class _Pending:
    settled: Settled
    keys: list[str]
    ticket: Ticket


class InFlight:
    def __init__(self, readback: Readback | None = None) -> None:
        self.readback = readback if readback is not None else Readback()
        self._q: collections.deque[_Pending] = collections.deque()

    def __len__(self) -> int:
        return len(self._q)

    def launch(
        self,
        t: int,
        job: StepJob,
        direct: bool,
        health: dict[str, Any],
        copied: CopyStats,
        exception: StepException | None = None,
    ) -> None:
        """Step ``t`` is over: copy its health tensors to the host (one copy per device)."""
        keys, tensors = [], []
        for k, v in health.items():
            if isinstance(v, torch.Tensor):
                keys.append(k)
                tensors.append(v)
        ticket = self.readback.launch(tensors)
        loss = health.get("loss")
        settled = Settled(t, job, direct, health, copied, exception, None)
        if isinstance(loss, (int, float)):
            settled.loss = float(loss)
        self._q.append(_Pending(settled, keys, ticket))

    def ready(self) -> list[Settled]:
        """The oldest steps whose copies are done, in order (never waits)."""
        out = []
        while self._q and self._done(self._q[0]):
            out.append(self._settle(self._q.popleft()))
        return out

    def drain(self) -> list[Settled]:
        """Every step still in flight, waiting for its copies."""
        out = []
        while self._q:
            p = self._q.popleft()
            p.ticket.wait()
            event = p.settled.job.event
            if event is not None:
                event.synchronize()
            out.append(self._settle(p))
        return out

    @staticmethod
    def _done(p: _Pending) -> bool:
        event = p.settled.job.event  # the batch's copy from the device, if any
        return p.ticket.ready() and (event is None or bool(event.query()))

    @staticmethod
    def _settle(p: _Pending) -> Settled:
        s = p.settled
        s.job.event = None  # done: the writer thread gets host memory only
        for k, v in zip(p.keys, p.ticket.values()):
            s.health[k] = v
            if k == "loss":
                s.loss = v
        return s

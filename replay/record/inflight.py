"""Steps whose health is still on its way from the device, in step order.

When a step returns, the recorder launches one copy of its health tensors (the loss, the
gradient norm before any clip, the flags' maxima, the scaler's scale, a DDP rank's own norm)
through a :class:`~replay.capture.readback.Readback`: one non-blocking copy into a reused host
buffer, an event after it. The step waits here, its record complete but for those values, until
the event says the copy is done; only then is its health row built from host floats and the
step published to the step log or handed to the writer thread, which so never waits for the
device. A CPU step's values are read at once (no copy: ``value_now``): it is settled before
``Recorder.step`` returns, as before. A GPU step's is normally settled at the next step or a few steps later (``ready``); a
flush, close or a step that raised waits for them all (``drain``). A batch copied from the
device carries its own event (``StepJob.event``), waited for too.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..capture.readback import Readback, Ticket, value_now
from ..capture.tensors import CopyStats
from ..store.contracts import StepException
from .writer_thread import StepJob

__all__ = ["InFlight", "PendingStep"]


@dataclass(slots=True)
class PendingStep:
    """One step, from what was taken before it ran (``StepCapture.before``) until its health
    is host floats (settled here) and it is passed on."""

    t: int
    copied: CopyStats
    rng: Any
    hparams: list[dict[str, Any]]
    modes: list[bool]
    health: dict[str, Any]
    scale: Any  # the scaler's scale before the step
    trainable: np.ndarray | None  # the parameters' requires_grad, when changed
    t0: float = 0.0
    step_fn: dict[str, Any] | None = None  # another step function than the step before's
    direct: bool = False  # its record is in the step log (``Transport.capture``)
    job: StepJob = None  # type: ignore[assignment]  # (set by Transport.capture)
    loss: Any = None  # the loss as the step returned it, and this rank's own gradient norm
    local_gn: Any = None
    exception: StepException | None = None  # the step raised
    value: float | None = None  # the loss's value, once settled (``None``: no loss)
    keys: list[str] | None = None  # the health values on their way to the host, and how
    ticket: Ticket | None = None


class InFlight:
    def __init__(self, readback: Readback | None = None) -> None:
        self.readback = readback if readback is not None else Readback()
        self.queue: collections.deque[PendingStep] = collections.deque()

    def launch(self, p: PendingStep) -> None:
        """Step ``p`` is over: its health tensors' values, read now where they are in host
        memory (``value_now``, which has the loss and the gradient norm already), else copied
        to the host (one copy per device)."""
        keys, tensors = [], []
        health = p.health
        for k, v in health.items():
            if isinstance(v, torch.Tensor):
                x = value_now(v)
                if x is None:
                    keys.append(k)
                    tensors.append(v)
                else:
                    health[k] = x  # (the same float the copy gives: float64 cast, first element)
        p.keys, p.ticket = keys, self.readback.launch(tensors)
        loss = p.health.get("loss")
        p.value = float(loss) if isinstance(loss, (int, float)) else None
        self.queue.append(p)

    def ready(self) -> list[PendingStep]:
        """The oldest steps whose copies are done, in order (never waits)."""
        out = []
        while self.queue and self._done(self.queue[0]):
            out.append(self._settle(self.queue.popleft()))
        return out

    def drain(self) -> list[PendingStep]:
        """Every step still in flight, waiting for its copies."""
        out = []
        while self.queue:
            p = self.queue.popleft()
            p.ticket.wait()  # type: ignore[union-attr]  # (launched)
            if p.job.event is not None:
                p.job.event.synchronize()
            out.append(self._settle(p))
        return out

    @staticmethod
    def _done(p: PendingStep) -> bool:
        event = p.job.event  # the batch's copy from the device, if any
        return p.ticket.ready() and (event is None or bool(event.query()))  # type: ignore[union-attr]

    @staticmethod
    def _settle(p: PendingStep) -> PendingStep:
        p.job.event = None  # done: the writer thread gets host memory only
        for k, v in zip(p.keys, p.ticket.values()):  # type: ignore[arg-type, union-attr]
            p.health[k] = v
            if k == "loss":
                p.value = v
        p.ticket = None
        return p

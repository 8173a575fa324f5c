"""When the recorder snapshots the run's objects, and into which slot of the file's ring.

The rings are sized once, at the first step, from that step's record (its batch and values,
about 16 KiB of RNG states and manifest) against ``keep_bytes`` (``store/retention.py``): a
larger batch keeps fewer steps. A snapshot is due every ``snapshot_every`` steps, and once more
half-way through the self-check's steps (``extra``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..capture.objects import RunObjects, gather_state
from ..capture.sharded import localize
from ..capture.tensors import CopyStats, copy_tree
from ..store.retention import ReachPlan, SnapshotSlots
from .config import RecorderConfig
from .transport import Transport

__all__ = ["Snapshots", "pow2"]


def pow2(n: int, lo: int, hi: int) -> int:
    """The least power-of-two multiple of ``lo`` that is at least ``n``, at most ``hi``."""
    p = lo
    while p < n and p < hi:
        p *= 2
    return p


class Snapshots:
    def __init__(self, config: RecorderConfig, objects: RunObjects, inner: Any) -> None:
        self.config = config
        self._objects = objects
        self._inner = inner  # the module inside a DDP wrapper: what replay's build returns
        self.step_hint: int | None = None  # bytes of the first step's batch and values
        self.extra: int | None = None  # one more snapshot step (the self-check's half-way)
        self._plan: ReachPlan | None = None
        self._slots: SnapshotSlots | None = None
        self._held: tuple[int, dict[str, Any], Any] | None = None  # (hold: step, state, event)

    def due(self, t: int) -> bool:
        return self.config.is_snapshot_step(t) or t == self.extra

    def step_guess(self) -> int:
        """A step record's size: the first step's batch and values, and about 16 KiB."""
        return (16 << 10) + (self.step_hint or 0)

    def plan(self) -> ReachPlan:
        """The rings' sizes, fixed at the first call (the first step): its record's size,
        rounded up to the arena's chunks, against the budget."""
        if self._plan is None:
            guess = self.step_guess()
            chunk = pow2(guess // 4, 16 << 10, 1 << 20)
            self._plan = self.config.plan(-(-guess // chunk) * chunk)
            self._slots = SnapshotSlots(self._plan)
        return self._plan

    def take(self, t: int, transport: Transport) -> None:
        """The objects' state before step ``t``, to the file (FSDP2: this rank's shards only,
        never gathered, with where they go back: ``capture/sharded.py``)."""
        self.plan()
        slot = self._slots.place(t)  # type: ignore[union-attr]  # (made by plan)
        transport.snapshot(t, slot, self._state())

    def _state(self) -> dict[str, Any]:
        live: dict[str, Any]
        live, dtensors = localize(gather_state(self._objects, self._inner))
        if dtensors:
            live["dtensors"] = dtensors
        return live

    def hold(self, t: int) -> None:
        """A framework's first step (``observe_begin``): its batch comes only at its end, and
        the rings are sized from it, so the state before it is copied now and goes to the file
        then (``release``). Sized from a guess instead, a run of 1 MiB batches kept 500 steps
        under a ``keep_bytes`` of 8 MiB, the default 15,000 steps whatever their size."""
        copied = CopyStats()
        state = copy_tree(self._state(), stats=copied)
        done = None
        if copied.cuda:  # copies to the host, non-blocking: waited for before they are read
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch stubs
            done.record()
        self._held = (t, state, done)

    def release(self, transport: Transport, step_bytes: int) -> None:
        """The held first snapshot to the file, the rings sized for steps of ``step_bytes``
        (called once, at the first step's end)."""
        self.step_hint = step_bytes
        if self._held is not None:
            (t, state, done), self._held = self._held, None
            if done is not None:
                done.synchronize()  # (long done: the whole step ran since)
            self.plan()
            transport.snapshot(t, self._slots.place(t), state)  # type: ignore[union-attr]

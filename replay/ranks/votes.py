"""A rank-consistent stop: when one rank's loss or own gradients go non-finite, all ranks stop at
the same step with the same error, instead of some raising and the rest hanging in a collective.

**Votes in DDP's own all-reduce** (:class:`BucketVotes`, under a ``DistributedDataParallel``
model): the recorder's communication hook (``ddp_hook.py``) appends every rank's vote to the last
gradient bucket of the step, so the stop costs no collective of its own. What a vote covers:

- this rank's own gradients at this step, measured before the all-reduce: a NaN/Inf stops every
  rank at the end of this step, naming the ranks whose gradients went bad;
- this rank's loss. The loss exists only inside the user's step function, and the hook runs in
  its backward before the step returns, so the loss rides the *next* reduction: a non-finite
  loss with finite gradients (rare: a NaN loss nearly always makes NaN gradients) stops every
  rank at the end of the next step that reduces, naming the step the loss went bad at. The
  parameters are still finite then (the update used finite gradients). At the last step of a
  run no reduction follows: nobody stops (one rank raising alone would hang the others in
  their next collective), and that rank says so with a warning when recording ends.

Under a GradScaler non-finite gradients do not vote (AMP skips such steps by design; the loss
does). Steps that do not reduce (``no_sync()`` accumulation) carry no votes: their gradients
accumulate into the next reduction, which votes on them, and a pending loss vote waits for it.

**The fallback** (:class:`ConsistentStop`): without the hook (the user's own comm hook, a model
that is not DDP-wrapped) every rank contributes its loss's flag to one tiny ``MAX`` all-reduce
at the end of every step: one extra collective a step (benchmarks/bench_ddp.py measured 472 us
on 2 CPU ranks). The recorder says so once, with a warning.

Both copy the result to the host with one non-blocking copy (``capture/readback.py``). On the
CPU it is read at once. With NCCL it is read at the start of the step ``VERDICT_LAG`` (2) steps
later, so every rank raises there, naming the step that went bad: by then the device has
normally finished the step that voted, and the copy is read without waiting; when it has not
(the training thread more than a step ahead of the device), the read waits for that step's copy
alone, while the next step's work stays queued. The ranks must all raise at the same step, so
a verdict cannot be read "whenever it is ready" as a single process's loss is.

A step that *raises* on one rank cannot take part: its peers are then blocked in DDP's own
gradient all-reduce or in this one, and no later collective can be matched safely. That rank
records its exception and re-raises; the others wait until the process group times out (they
then record a ``DistBackendError`` at that step) or the launcher (torchrun) terminates them —
their completed steps are on disk either way. ``replay bisect`` on the rank set names the rank
whose exception was its own.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..capture.readback import Readback, Ticket
from .context import device_of
from .ddp_hook import LocalGradProbe

__all__ = ["Verdict", "BucketVotes", "ConsistentStop", "VERDICT_LAG"]

#: A device verdict (NCCL) is read at the start of the step this many steps after it voted.
VERDICT_LAG = 2


@dataclass(frozen=True)
class Verdict:
    """The ranks agree that step ``step`` went bad on ``ranks``; they stop at ``stopped_at``."""

    step: int
    ranks: tuple[int, ...]
    stopped_at: int


def _nonfinite(v: Any) -> float | torch.Tensor:
    """1 when ``v`` (a float, or a tensor: then without a host sync) is NaN/Inf, else 0."""
    if isinstance(v, torch.Tensor):
        return (~torch.isfinite(v.detach())).to(torch.float32)
    if isinstance(v, (float, int)):
        return 0.0 if math.isfinite(v) else 1.0
    return 0.0


class _Stop:
    """What both stops share: the steps' verdicts, each copied to the host (``result``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._readback = Readback()
        self._pending: collections.deque[tuple[int, Ticket | None]] = collections.deque()
        self.stopped_at: int | None = None  # the step the first verdict read stopped the ranks at

    @property
    def deferred(self) -> bool:
        return self.device.type == "cuda"

    def result(self, keep: int = 0) -> Verdict | None:
        """The first verdict among the steps posted, but the newest ``keep``: read from their
        copies (waiting for a copy not yet done: see the module docstring)."""
        verdict = None
        while len(self._pending) > keep:
            step, ticket = self._pending.popleft()
            if ticket is not None:
                ticket.wait()
                verdict = verdict or self._verdict(step, ticket.values())
        if verdict is not None and self.stopped_at is None:
            self.stopped_at = verdict.stopped_at
        return verdict

    def _verdict(self, step: int, v: list[float]) -> Verdict | None:
        raise NotImplementedError


class BucketVotes(_Stop):
    """The stop agreed through the probe's votes: no collective of its own."""

    def __init__(self, probe: LocalGradProbe, world_size: int, device: torch.device) -> None:
        super().__init__(device)
        self.probe, self.world_size = probe, world_size
        self._last_step: int | None = None

    def pending_loss(self) -> int | None:
        """The step this rank's loss went non-finite at, when no reduction has carried its vote
        yet (read once recording ends)."""
        k = float(self.probe.late_loss)
        if k <= 0 or self._last_step is None:
            return None
        step = self._last_step - round(k) + 1
        # A verdict already stopped every rank there (the step's gradients went non-finite
        # too, and voted): its loss has nothing left to tell anyone.
        if self.stopped_at is not None and step <= self.stopped_at:
            return None
        return step

    def post(self, step: int, loss: Any, local_grad_norm: torch.Tensor | None) -> None:
        """Step ``step`` is over: take the votes its reduction carried, queue this rank's loss."""
        self._last_step = step
        votes = self.probe.take_votes()
        bad_loss = _nonfinite(loss)
        late = self.probe.late_loss
        self._pending.append((step, None if votes is None else self._readback.launch_whole(votes)))
        if votes is not None:
            # A pending loss vote was cast now (the verdict stops every rank); this step's loss
            # votes at the next reduction.
            self.probe.late_loss = bad_loss
        elif isinstance(late, torch.Tensor) or isinstance(bad_loss, torch.Tensor):
            late_t = torch.as_tensor(late, dtype=torch.float32, device=self.device)
            self.probe.late_loss = torch.where(
                late_t > 0, late_t + 1, torch.as_tensor(bad_loss, device=self.device)
            )
        else:  # still waiting for a reduction: one step older
            self.probe.late_loss = late + 1 if late > 0 else bad_loss

    def _verdict(self, step: int, v: list[float]) -> Verdict | None:
        w = self.world_size
        # When each rank went bad: its gradients at this step (their slot holds NaN, from
        # norm - norm), its loss k steps ago.
        went_bad = {r: step for r in range(w) if v[r] != 0}
        for r in range(w):
            if v[w + r] > 0:
                went_bad[r] = min(went_bad.get(r, step), step - round(v[w + r]))
        if not went_bad:
            return None
        first = min(went_bad.values())  # name the first bad step, and who went bad there
        return Verdict(first, tuple(r for r in sorted(went_bad) if went_bad[r] == first), step)


class ConsistentStop(_Stop):
    """The fallback: one tiny all-reduce of the ranks' loss flags at the end of every step."""

    def __init__(self, rank: int, world_size: int, group: Any) -> None:
        super().__init__(device_of(group))
        self.rank, self.world_size, self.group = rank, world_size, group

    def post(self, step: int, loss: Any, local_grad_norm: torch.Tensor | None) -> None:
        """Join this step's all-reduce with this rank's flag (no host sync for device tensors)."""
        bad = torch.zeros((), dtype=torch.float32, device=self.device)
        for v in (loss, local_grad_norm):
            f = _nonfinite(v)
            if isinstance(f, torch.Tensor):
                bad = torch.maximum(bad, f.to(self.device))
            elif f:
                bad.fill_(1.0)
        flags = torch.zeros(self.world_size, dtype=torch.float32, device=self.device)
        flags[self.rank] = bad
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=self.group)
        self._pending.append((step, self._readback.launch_whole(flags)))

    def _verdict(self, step: int, v: list[float]) -> Verdict | None:
        bad = tuple(r for r, f in enumerate(v) if f > 0)
        return Verdict(step, bad, step) if bad else None

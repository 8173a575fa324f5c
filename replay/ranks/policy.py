"""What recording does about the other ranks: nothing in a single process, and under DDP the
per-rank gradient probe and the rank-consistent stop (``votes.py``, ``ddp_hook.py``).

Under a ``DistributedDataParallel`` model the stop's votes ride DDP's own last gradient
all-reduce of the step (no collective of its own). Only when the probe cannot be installed (the
user's own comm hook, a model that is not DDP-wrapped) do the ranks agree with one extra tiny
all-reduce per step, on the loss alone; a :class:`RecorderWarning` says so once.

The recorder asks the same three questions every step, of :class:`SingleProcess` or of
:class:`DdpRanks`: is a verdict of the ranks pending from the last step (``before_step``), what
was this rank's own gradient norm (``local_grad_norm``), and, once the step is over, do the
ranks agree that it went bad (``after_step``, which raises on every rank at the same step).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..capture.sharded import layout
from ..errors import RecorderWarning
from .context import device_of
from .ddp_hook import LocalGradProbe
from .votes import VERDICT_LAG, BucketVotes, ConsistentStop, Verdict

__all__ = ["RankPolicy", "SingleProcess", "DdpRanks"]

#: Called with the verdict and this rank's loss when the ranks agree a step went bad: it raises.
OnBad = Callable[[Verdict, Any], None]


class RankPolicy:
    """The interface; :class:`SingleProcess` is the one that does nothing."""

    #: Whether the ranks agree on the non-finite stop (then the recorder's own check is off).
    agrees = False

    def before_step(self) -> None:
        """Raise the verdict of the last step's agreement when it was read a step late."""

    def local_grad_norm(self) -> torch.Tensor | None:
        return None

    def after_step(self, t: int, loss: Any, local_gn: torch.Tensor | None) -> None:
        """This rank's vote on step ``t`` (every rank must vote every step, recorded or not)."""

    def close(self) -> None:
        """Recording ends: say what was left unagreed (no collective: the ranks may not all be
        here)."""


class SingleProcess(RankPolicy):
    pass


class DdpRanks(RankPolicy):
    def __init__(
        self,
        dist: Any,
        model: torch.nn.Module,
        inner: torch.nn.Module,
        params: list[torch.Tensor],
        *,
        stop: bool,
        on_bad: OnBad,
        grads_vote: bool = True,
    ) -> None:
        self._probe: LocalGradProbe | None = None
        why: str | None = "the model is not wrapped in DistributedDataParallel"
        if layout(inner) is not None:
            why = (
                "FSDP2's fully_shard has no DDP communication hook to measure in; grad_norm is "
                "this rank's shard's"
            )
        if inner is not model:  # a DDP wrapper: its communication hook sees the local grads
            self._probe = LocalGradProbe(
                model,
                params,
                rank=dist.rank,
                world_size=dist.world_size,
                votes=stop,
                grads_vote=grads_vote,
            )
            why = self._probe.install()
            if why is not None:
                self._probe = None
        self._stop: BucketVotes | ConsistentStop | None = None
        if stop and self._probe is not None:
            self._stop = BucketVotes(self._probe, dist.world_size, device_of(dist.group))
        elif stop:
            self._stop = ConsistentStop(dist.rank, dist.world_size, dist.group)
        if self._probe is None and (inner is not model or stop):
            warnings.warn(
                f"replay: no per-rank gradient check ({why}); local_grad_norm is not recorded"
                + (
                    ", and the ranks agree on a stop on the loss alone, with one extra "
                    "all-reduce per step"
                    if stop
                    else ""
                ),
                RecorderWarning,
                stacklevel=3,
            )
        self.agrees = self._stop is not None
        self._on_bad = on_bad
        self._losses: dict[int, Any] = {}  # the loss of each step whose verdict is still unread

    def before_step(self) -> None:
        """A device verdict is read ``VERDICT_LAG`` steps after its step voted (votes.py):
        the ones older than the step before this one."""
        if self._stop is not None and self._stop.deferred:
            self._raise_if_bad(self._stop.result(keep=VERDICT_LAG - 1))

    def local_grad_norm(self) -> torch.Tensor | None:
        return self._probe.take() if self._probe is not None else None

    def after_step(self, t: int, loss: Any, local_gn: torch.Tensor | None) -> None:
        if self._stop is None:
            return
        self._stop.post(t, loss, local_gn)
        self._losses[t] = loss
        self._losses.pop(t - VERDICT_LAG - 1, None)  # (read by now)
        if not self._stop.deferred:
            self._raise_if_bad(self._stop.result())

    def _raise_if_bad(self, verdict: Verdict | None) -> None:
        if verdict is not None:
            self._on_bad(verdict, self._losses.get(verdict.stopped_at))

    def close(self) -> None:
        stop, self._stop = self._stop, None
        if stop is None:
            return
        verdict = stop.result() if stop.deferred else None
        if verdict is not None:  # (identical on every rank: each warns the same)
            warnings.warn(
                f"replay: the ranks agreed that step {verdict.step} went non-finite on rank(s) "
                f"{', '.join(map(str, verdict.ranks))}, read only as recording ended (a GPU "
                f"verdict is read {VERDICT_LAG} steps later); it is recorded",
                RecorderWarning,
                stacklevel=3,
            )
        if isinstance(stop, BucketVotes):
            pending = stop.pending_loss()
            if pending is not None:
                warnings.warn(
                    f"replay: this rank's loss went non-finite at step {pending} with finite "
                    "gradients, and the run ended before the next gradient all-reduce could "
                    "carry that to the other ranks: nobody stopped; the step is recorded "
                    "(`replay bisect` finds it)",
                    RecorderWarning,
                    stacklevel=3,
                )

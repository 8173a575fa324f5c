"""A rank-consistent stop: when one rank's loss or own gradients go non-finite, all ranks stop at
the same step with the same error, instead of some raising and the rest hanging in a collective.

Once per step, at the end of ``Recorder.step``, every rank contributes one flag to a
``world_size``-long tensor reduced with ``MAX`` (one tiny all-reduce; benchmarks/bench_ddp.py
measures it). The result names the ranks that went bad. On the CPU it is read at once; with NCCL
it is read at the start of the next step (no host sync on the hot path), so every rank raises
there, naming the step that went bad.

A step that *raises* on one rank cannot take part: its peers are then blocked in DDP's own
gradient all-reduce or in this one, and no later collective can be matched safely. That rank
records its exception and re-raises; the others wait until the process group times out (they
then record a ``DistBackendError`` at that step) or the launcher (torchrun) terminates them —
their completed steps are on disk either way. ``replay bisect`` on the rank set names the rank
whose exception was its own.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["ConsistentStop"]


class ConsistentStop:
    def __init__(self, rank: int, world_size: int, group: Any) -> None:
        self.rank, self.world_size, self.group = rank, world_size, group
        backend = str(torch.distributed.get_backend(group))
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        self._pending: tuple[int, torch.Tensor] | None = None

    def post(self, step: int, loss: Any, local_grad_norm: torch.Tensor | None) -> None:
        """Join this step's all-reduce with this rank's flag (no host sync for device tensors)."""
        bad = torch.zeros((), dtype=torch.float32, device=self.device)
        for v in (loss, local_grad_norm):
            if isinstance(v, torch.Tensor):
                bad = torch.maximum(
                    bad, (~torch.isfinite(v.detach())).to(self.device, torch.float32)
                )
            elif isinstance(v, float) and not math.isfinite(v):
                bad.fill_(1.0)
        flags = torch.zeros(self.world_size, dtype=torch.float32, device=self.device)
        flags[self.rank] = bad
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=self.group)
        self._pending = (step, flags)

    @property
    def deferred(self) -> bool:
        return self.device.type == "cuda"

    def result(self) -> tuple[int, tuple[int, ...]] | None:
        """``(step, bad_ranks)`` of the last posted step when some rank went bad, else ``None``."""
        if self._pending is None:
            return None
        step, flags = self._pending
        self._pending = None
        bad = torch.nonzero(flags.cpu() > 0).flatten().tolist()
        return (step, tuple(int(r) for r in bad)) if bad else None

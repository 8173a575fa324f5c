"""This rank's own gradient norm, taken in DDP's communication hook before the all-reduce.

After the all-reduce every rank holds the average, so a NaN from one rank's batch shows on all of
them. The hook sees ``bucket.buffer()`` while it is still local: it takes one norm
per parameter (``bucket.parameters()`` maps the slices back, also after DDP rebuilds its buckets
following the first iteration) and then delegates to DDP's default all-reduce hook, so training
computes exactly what it would without it.

The per-parameter norms are combined at the end of the step the way
``replay.capture.fingerprint.grad_norm`` combines them (same order, grouping and dtypes), so a
single-process replay of this rank's step recomputes ``local_grad_norm`` bitwise.
Everything stays a tensor: no host sync.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ...capture.fingerprint import group_by_dtype

__all__ = ["LocalGradProbe"]


class LocalGradProbe:
    """Registers itself as the DDP comm hook of ``ddp``; ``take()`` returns the step's local norm.

    ``params`` fixes the order of the combination: the optimizer's parameters, as the recorder's
    ``grad_norm`` uses them. DDP accepts one comm hook per model: when the user registered their
    own, :meth:`install` returns why the probe is off (the columns then read NaN).
    """

    def __init__(self, ddp: Any, params: list[torch.Tensor]) -> None:
        self._ddp = ddp
        self._index = {id(p): i for i, p in enumerate(params)}
        self._norms: dict[int, torch.Tensor] = {}
        self.error: str | None = None

    def install(self) -> str | None:
        if getattr(self._ddp, "_comm_hooks", None):
            return "the model already has a DDP communication hook (DDP allows one)"
        try:
            self._ddp.register_comm_hook(self._ddp.process_group, self._hook)
        except (RuntimeError, ValueError) as e:  # refused: train on without the probe
            return str(e).splitlines()[0]
        return None

    # No annotations: DDP checks them against dist.GradBucket, and this module's are strings.
    def _hook(self, process_group, bucket):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        if self.error is None:
            try:
                with torch.no_grad():
                    norms = torch._foreach_norm(bucket.gradients())
                for p, n in zip(bucket.parameters(), norms):
                    i = self._index.get(id(p))
                    if i is not None:
                        self._norms[i] = n
            except Exception as e:  # noqa: BLE001 - the probe must never break the all-reduce
                self.error = f"{type(e).__name__}: {e}"
        return default_hooks.allreduce_hook(process_group, bucket)

    def take(self) -> torch.Tensor | None:
        """This step's local gradient norm (float64 tensor), ``None`` if no bucket was reduced.

        Resets the probe. Gradient accumulation under ``no_sync()`` reduces only on the last
        micro-step, so only that step has a value.
        """
        if not self._norms:
            return None
        norms = [self._norms[i] for i in sorted(self._norms)]
        self._norms = {}
        with torch.no_grad():
            total = None
            for g in group_by_dtype(norms):  # as fingerprint.grad_norm: bitwise the same
                sq = torch.stack(g).to(torch.float64).square().sum()
                total = sq if total is None else total + sq.to(total.device)
            return total.sqrt()  # type: ignore[union-attr]

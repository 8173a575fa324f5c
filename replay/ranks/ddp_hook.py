"""This rank's own gradient norm, taken in DDP's communication hook before the all-reduce, and
the ranks' stop votes, carried by DDP's own last all-reduce of the step. The recorder installs
it, and a rank replay (``workflows/rank_worker.py``) installs it again where the recording
shows it, so that the buckets meet as they did.

After the all-reduce every rank holds the average, so a NaN from one rank's batch shows on all of
them. The hook sees ``bucket.buffer()`` while it is still local: it takes one norm
per parameter (``bucket.parameters()`` maps the slices back, also after DDP rebuilds its buckets
following the first iteration) and then averages the bucket as DDP's default all-reduce hook does
(divide by the world size, then sum), so training computes what it would without it.

The per-parameter norms are combined at the end of the step the way
``replay.capture.fingerprint.grad_norm`` combines them (same order, grouping and dtypes), so a
single-process replay of this rank's step recomputes ``local_grad_norm`` bitwise.
Everything stays a tensor: no host sync.

**Votes** (``votes=True``, the rank-consistent stop; ``ranks/votes.py`` reads
them). DDP launches its buckets in index order, so when the last bucket is handed over every local gradient of the
step has been measured. Its all-reduce then carries ``2 * world_size`` extra elements, zero but
for this rank's two slots: ``[r]`` is NaN when this rank's own gradients hold a NaN/Inf (it is
``norm - norm`` of the local norm the probe records anyway: one op), ``[world_size + r]`` is
``k`` when this rank's *loss* went non-finite ``k`` steps ago with finite gradients (the loss is
computed after the forward, in the user's step function, and the hook cannot see it; the
recorder sees it when the step returns and hands it to the next reduction).
The division by the world size goes straight into the longer buffer (``torch.div(out=)``: the
copy costs no extra pass), the votes are written after it, and the summed result is handed back
to DDP as a view of its first ``numel`` elements: no copy out. No collective is added.

With three or more ranks the longer last bucket may change the order in which the backend sums
some of its elements (last-bit differences from a run without the recorder, as a different
``bucket_cap_mb`` would make); a sum of two is the same in either order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..capture.fingerprint import group_by_dtype
from ..errors import first_line

__all__ = ["LocalGradProbe"]


class LocalGradProbe:
    """Registers itself as the DDP comm hook of ``ddp``; ``take()`` returns the step's local norm.

    ``params`` fixes the order of the combination: the optimizer's parameters, as the recorder's
    ``grad_norm`` uses them. DDP accepts one comm hook per model: when the user registered their
    own, :meth:`install` returns why the probe is off (the columns then read NaN).

    With ``votes=True`` the last bucket's all-reduce also carries the ranks' stop votes (see the
    module docstring): :meth:`take_votes` returns them, summed over the ranks. ``grads_vote``:
    whether non-finite local gradients vote for a stop (not under a GradScaler, whose skipped
    steps hold infinities by design). ``late_loss``: this rank's pending loss vote, set by the
    caller (``0``, or the number of steps since its loss went non-finite; a tensor on a GPU).
    """

    def __init__(
        self,
        ddp: Any,
        params: list[torch.Tensor],
        *,
        rank: int = 0,
        world_size: int = 1,
        votes: bool = False,
        grads_vote: bool = True,
    ) -> None:
        self._ddp = ddp
        self._index = {id(p): i for i, p in enumerate(params)}
        self._norms: dict[int, torch.Tensor] = {}
        self.error: str | None = None
        self._rank, self._world = rank, world_size
        self._votes = votes
        self._grads_vote = grads_vote
        self.late_loss: float | torch.Tensor = 0.0
        self._reduced: list[torch.Tensor] = []  # this step's summed votes, one per reduction
        self._total: torch.Tensor | None = None  # the step's local norm, once combined
        # the votes' all-reduce buffer and its views: (all, gradients, votes, own two slots)
        self._ext: tuple[torch.Tensor, ...] | None = None

    def install(self) -> str | None:
        if getattr(self._ddp, "_comm_hooks", None):
            return "the model already has a DDP communication hook (DDP allows one)"
        try:
            self._ddp.register_comm_hook(self._ddp.process_group, self._hook)
        except (RuntimeError, ValueError) as e:  # refused: train on without the probe
            return first_line(e)
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
        if self._votes and bucket.is_last():
            # Every rank takes this branch at the same bucket of the same step: the tensors that
            # meet in the all-reduce have the same length everywhere.
            return self._reduce_with_votes(process_group, bucket.buffer())
        return default_hooks.allreduce_hook(process_group, bucket)

    def _reduce_with_votes(self, process_group: Any, buf: torch.Tensor) -> Any:
        group: Any = process_group if process_group is not None else torch.distributed.group.WORLD
        n = buf.numel()
        parts = self._ext
        if (
            parts is None
            or parts[0].numel() != n + 2 * self._world
            or parts[0].dtype != buf.dtype
            or parts[0].device != buf.device
            or self._reduced
        ):
            # Kept across steps (DDP has copied the result out by the end of each backward);
            # reallocated when DDP rebuilds its buckets after the first iteration, and for a
            # second backward in one step (the first one's votes are still to be read).
            w, r = self._world, self._rank
            e = torch.empty(n + 2 * w, dtype=buf.dtype, device=buf.device)
            parts = self._ext = (e, e[:n], e[n:], e[n + r], e[n + w + r])
        ext, head, votes, grads_slot, loss_slot = parts
        with torch.no_grad():
            torch.div(buf, group.size(), out=head)  # the default hook's average, copied in
            votes.zero_()  # (it holds the last step's sums)
            if self._grads_vote and self.error is None and self._norms:
                # All local gradients are measured now: their norm, which take() hands on, is
                # also the vote. total - total is 0 when it is finite and NaN when it is not.
                self._total = total = self._combine()
                if total is not None:
                    torch.sub(total, total, out=grads_slot)
            late = self.late_loss
            if isinstance(late, torch.Tensor):
                loss_slot.copy_(late)
            elif late:
                loss_slot.fill_(late)
        self._reduced.append(votes)
        fut = torch.distributed.all_reduce(ext, group=group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].narrow(0, 0, n))

    def _combine(self) -> torch.Tensor | None:
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

    def take(self) -> torch.Tensor | None:
        """This step's local gradient norm (float64 tensor), ``None`` if no bucket was reduced.

        Resets the probe. Gradient accumulation under ``no_sync()`` reduces only on the last
        micro-step, so only that step has a value.
        """
        if self._norms:  # measured after the last vote (a second backward), or without votes
            self._total = self._combine()
        total, self._total = self._total, None
        return total

    def take_votes(self) -> torch.Tensor | None:
        """The votes summed over the ranks at this step's reduction (``2 * world_size``
        elements, read once DDP's backward waited for it), ``None`` when DDP did not reduce.
        Several reductions in one step (several backwards) are merged: any gradient vote, the
        oldest loss vote."""
        reduced, self._reduced = self._reduced, []
        if len(reduced) <= 1:
            return reduced[0] if reduced else None
        w = self._world
        with torch.no_grad():
            v = torch.stack([r.float() for r in reduced])
            return torch.cat([v[:, :w].sum(0), v[:, w:].amax(0)])

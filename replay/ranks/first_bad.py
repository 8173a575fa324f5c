"""The first (step, rank) of a DDP run that went bad, and what each rank showed.

Why the *local* columns decide: the all-reduce averages gradients, so one rank's NaN shows in every
rank's ``grad_norm`` and parameters at the same step. Only the loss, the exception and the gradient
measured before the all-reduce (``local_grad_norm``) belong to one rank.

numpy + h5py only (no torch): ``replay info`` and the TUI read rank sets without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..reports.ranks import RankFailure
from ..reports.verdict import Ended
from ..store.reader import Recording
from .files import RankFiles

__all__ = [
    "RankEvidence",
    "describe_after",
    "describe_failure",
    "first_bad_rank",
    "is_collective_error",
    "rank_evidence",
]

# Exceptions a rank raises because *another* rank failed (a collective timed out or its peer
# vanished): never the culprit when a rank with its own failure exists at the same step.
_COLLECTIVE_ERRORS = {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}
# What gloo and NCCL say, inside a plain RuntimeError (DDP's all-reduce runs in a comm hook
# future: "Got the following error when running the callback: ..."), when a peer crashed or
# never joined the collective.
_PEER_GONE = (
    "connection closed by peer",
    "connection reset by peer",
    "remote worker crashing",
    "timed out waiting",
    "nccl communicator was aborted",
    "watchdog caught collective operation timeout",
)


def is_collective_error(exc: dict[str, Any] | None) -> bool:
    """Whether a recorded exception (``{type, module, message}``) is a collective that failed
    because a peer did (timed out, or its process vanished), not the rank's own failure."""
    if not exc:
        return False
    if exc.get("type") in _COLLECTIVE_ERRORS or str(exc.get("module", "")).startswith(
        "torch.distributed"
    ):
        return True
    msg = str(exc.get("message", "")).lower()
    return any(p in msg for p in _PEER_GONE)


def _own_failures(rec: Recording, h: dict[str, np.ndarray]) -> dict[int, list[str]]:
    """Steps at which this rank's *own* values went bad (``loss``, ``local_grad``, ``exception``).

    A ``torch.distributed`` error (a collective that timed out because a peer failed) is not the
    rank's own failure.
    """
    out: dict[int, list[str]] = {}
    for col, reason in (("loss_nonfinite", "loss"), ("local_grad_nonfinite", "local_grad")):
        for s in h["step"][h[col] == 1]:
            out.setdefault(int(s), []).append(reason)
    for s in h["step"][h["raised"] == 1]:
        try:
            exc = rec.read_step(int(s)).get("exception")  # (a dict of strings: check_record)
        except KeyError:  # its record left the ring: judge it by its health alone
            exc = None
        if not is_collective_error(exc):
            out.setdefault(int(s), []).append("exception")
    return out


@dataclass(frozen=True)
class RankEvidence:
    """Where one rank's file first shows a failure: its *own* (``loss``, ``local_grad``,
    ``exception``) and what it saw after the all-reduce (``grad_nonfinite``,
    ``param_nonfinite``, ``raised``). Small, so a scan's worker processes hand it back."""

    own_step: int | None
    own: tuple[str, ...]
    seen_step: int | None
    seen: tuple[str, ...]
    ended: Ended | None = None  # the program raised outside any step (its /ended)


def rank_evidence(rec: Recording, h: dict[str, np.ndarray] | None = None) -> RankEvidence:
    """What ``rec`` (one rank's file) contributes to :func:`first_bad_rank`."""
    h = rec.health() if h is None else h
    own = _own_failures(rec, h)
    own_step = min(own) if own else None
    seen: dict[int, list[str]] = {}
    skipped = h["scaler_skipped"] == 1
    for col in ("grad_nonfinite", "param_nonfinite", "raised"):
        mask = h[col] == 1
        if col == "grad_nonfinite":
            mask &= ~skipped
        if mask.any():
            seen.setdefault(int(h["step"][mask].min()), []).append(col)
    seen_step = min(seen) if seen else None
    return RankEvidence(
        own_step,
        tuple(own[own_step]) if own_step is not None else (),
        seen_step,
        tuple(seen[seen_step]) if seen_step is not None else (),
        rec.ended(),
    )


def first_bad_rank(
    rank_set: RankFiles | dict[int, Recording] | dict[int, RankEvidence],
) -> RankFailure | None:
    """The first step at which some rank's own loss, gradients or step went bad, and which ranks.

    ``None`` when no rank shows a failure. Among the ranks bad at that step all are named; an
    exception counts before a non-finite value only in ``kind``, never by hiding a rank.
    ``rank_set`` may also be each rank's :func:`rank_evidence` (what a scan collects).
    """
    recs = rank_set.recordings if isinstance(rank_set, RankFiles) else rank_set
    ev = {r: x if isinstance(x, RankEvidence) else rank_evidence(x) for r, x in recs.items()}
    return _died_first(ev, _first_failure(ev))


def _died_first(ev: dict[int, RankEvidence], failure: RankFailure | None) -> RankFailure | None:
    """``failure``, unless a rank's program died outside any step before it (its ``/ended``):
    that rank never came to its next step, so the others' next collective failed for want of it
    (gloo: "Connection closed by peer"; NCCL: a watchdog timeout), which is no failure of
    theirs. The step a dead rank never entered is the one after its last."""
    never = {
        r: (e.ended.last_step + 1 if e.ended.last_step is not None else 0)
        for r, e in ev.items()
        if e.ended is not None
    }
    if not never:
        return failure
    step = min(never.values())
    if failure is not None and failure.step < step:
        return failure
    dead = tuple(sorted(r for r, s in never.items() if s == step))
    ended = ev[dead[0]].ended
    return RankFailure(step, dead, "died", True, {r: ["died"] for r in dead}, ended, failure)


def _first_failure(ev: dict[int, RankEvidence]) -> RankFailure | None:
    owns = [e.own_step for e in ev.values() if e.own_step is not None]
    if owns:
        step = min(owns)
        evidence = {r: list(e.own) for r, e in ev.items() if e.own_step == step}
        kind = "exception" if any("exception" in v for v in evidence.values()) else "nonfinite"
        return RankFailure(step, tuple(sorted(evidence)), kind, True, evidence)
    # No rank's own values went bad: fall back to what every rank sees after the all-reduce.
    seens = [e.seen_step for e in ev.values() if e.seen_step is not None]
    if not seens:
        return None
    step = min(seens)
    evidence = {r: list(e.seen) for r, e in ev.items() if e.seen_step == step}
    kind = "exception" if all(v == ["raised"] for v in evidence.values()) else "nonfinite"
    return RankFailure(step, tuple(sorted(evidence)), kind, False, evidence)


def describe_failure(f: RankFailure | None) -> str:
    """One line for people: where the run went bad and on which rank(s)."""
    if f is None:
        return "no rank recorded a NaN/Inf or an exception"
    if f.kind == "died" and f.ended is not None:
        who = " and ".join(f"rank {r}" for r in f.ranks)
        said = f"{who} died: {f.ended.describe()}"
        if f.after is not None:
            said += f"; then {describe_after(f.after)}"
        return said
    who = ", ".join(f"rank {r} ({'+'.join(f.evidence[r])})" for r in f.ranks)
    if f.local:
        return f"first bad at step {f.step} on {who}"
    return (
        f"step {f.step} went bad on {who} after the all-reduce, but no rank's own loss or "
        "gradients did (an overflow in the reduction, or ranks recorded without the DDP probe)"
    )


def describe_after(f: RankFailure) -> str:
    """What the other ranks showed once a peer had died."""
    who = ", ".join(f"rank {r}" for r in f.ranks)
    if f.kind == "exception" and not f.local:
        return f"{who} raised at step {f.step} in a collective the dead rank never joined"
    return describe_failure(f)

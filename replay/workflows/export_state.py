"""Reaching the state ``replay export`` writes: a snapshot, then the recorded steps replayed from
it, each one checked bitwise against the recording on the way (as ``replay verify`` does).

A run that failed at step 21 with ``snapshot_every=50`` used to export the snapshot of step 0:
the state right before the failure is 21 replayed steps away, and replay can reach it exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..bisect.compare import compare_rows, with_exception_type
from ..errors import ReplayError, UsageError
from ..store.tree import as_record, map_tree

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = ["NotReached", "Diverged", "OutsideState", "finite", "reach"]


class NotReached(ReplayError):
    """The state before the step cannot be exported as the recording had it."""


class Diverged(NotReached):
    """A replayed step on the way differs from the recording (exit 5, as ``verify``)."""


class OutsideState(NotReached, UsageError):
    """An object the loop steps outside the step function: its state in between is unknown."""


def _others(objs: Any) -> dict[str, Any]:
    """The objects besides the model and the optimizer (which the step function updates)."""
    named = {n: objs.named.get(n) for n in ("scheduler", "scaler", *objs.extras)}
    return {n: o for n, o in named.items() if o is not None and hasattr(o, "state_dict")}


def _plain(x: Any) -> Any:
    """A state dict with its tensors as bytes: comparable with ``==``, bit for bit."""
    return map_tree(_plain_leaf, x, as_record)


def _plain_leaf(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        return (
            "tensor",
            str(t.dtype),
            tuple(t.shape),
            t.reshape(-1).view(torch.uint8).numpy().tobytes(),
        )
    return ("nan",) if isinstance(x, float) and x != x else x


def finite(engine: Engine) -> bool:
    """Whether every parameter of the live model is finite."""
    import torch

    return all(bool(torch.isfinite(p).all()) for p in engine.objs.model.parameters())


def reach(engine: Engine, step: int) -> int:
    """Make the engine's live objects hold the state right before ``step``: the newest snapshot
    at or before it, then the steps in between replayed and each compared bitwise with its
    recorded health row. Returns how many replayed steps were compared; raises
    :class:`NotReached` when the state cannot be the recorded one."""
    snapshot = engine.window.snapshot_for(step)
    engine.invalidate()  # from the snapshot itself, never from a state left by an earlier try
    engine.state_before(snapshot)
    if step == snapshot:
        return 0
    objs = engine.objs
    before = {n: _plain(o.state_dict()) for n, o in _others(objs).items()}
    rows = {
        int(r["step"]): with_exception_type(r, engine.recorded_exception)
        for r in engine.recorded_rows()
    }
    compared = 0
    for t in range(snapshot, step):
        replayed = engine.run_step(t).row()
        recorded = rows.get(t)
        d = compare_rows(recorded, replayed)
        if d is not None:
            raise Diverged(
                f"replaying step {t} from the snapshot of step {snapshot} does not match the "
                f"recording ({d.column}: recorded {d.recorded}, replayed {d.replayed}), "
                f"so the state before step {step} would not be the recorded one; run `replay "
                f"verify` to see why, or export the snapshot's own state: --step {snapshot}"
            )
        compared += recorded is not None
    engine.state_before(step)  # (the live state is there: this puts step's RNG in place)
    stale = [n for n, o in _others(objs).items() if _plain(o.state_dict()) == before[n]]
    if stale:
        at = ", ".join(str(s) for s in engine.window.snapshots)
        raise OutsideState(
            f"--step {step}: replaying steps {snapshot}..{step - 1} did not change "
            f"{', '.join(stale)} (the loop steps it outside the step function, which "
            f"replay does not run), so its state before step {step} is unknown; "
            f"export the state of a snapshot: --step {at}"
        )
    return compared

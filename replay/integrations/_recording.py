"""What the framework callbacks share: starting their Recorder (saying what it records when the
run cannot be replayed), recording the window an exception broke, counting a scheduler's steps
and summing a window's losses. Imports no framework."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..errors import NonFiniteLossError, RecorderWarning
from ..record.recorder import Recorder
from ..store.tree import ObjectRecord, keep_kind, map_tree

__all__ = ["clone_batch", "record_raised", "sched_count", "start_recorder", "total_loss"]


def clone_batch(batch: Any, objects: Callable[[Any, ObjectRecord], Any] = keep_kind) -> Any:
    """A copy of a batch the training step cannot change under us (an in-place
    normalisation); ``objects`` rebuilds an object batch (``store.tree.map_tree``)."""
    return map_tree(
        lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, batch, objects
    )


def start_recorder(path: str, **kwargs: Any) -> Recorder | None:
    """A started :class:`Recorder`, or ``None`` (said once) when it cannot start: the recorder
    never takes training down. A run whose steps replay cannot rebuild (``not_replayable``:
    why) is said so once first."""
    why = kwargs.get("not_replayable")
    if why is not None:
        warnings.warn(
            f"replay: {why}: replay cannot rebuild this run's steps; ReplayCallback records their "
            "health, batches and RNG states (no snapshots): replay info, doctor and tui read "
            "them, bisect names the first bad step without replaying it",
            RecorderWarning,
            stacklevel=3,
        )
    try:
        rec = Recorder(path, **kwargs)
    except Exception as e:  # noqa: BLE001 - the recorder must never take training down
        warnings.warn(
            f"replay: ReplayCallback records nothing ({type(e).__name__}: {e})",
            RecorderWarning,
            stacklevel=3,
        )
        return None
    rec.__enter__()
    return rec


def record_raised(
    rec: Recorder, window: list[Any] | None, values: dict[str, Any], e: BaseException
) -> None:
    """The window under way when the framework's loop raised ``e``, recorded with it as
    ``Recorder.step`` records a step: an ``Exception`` is the step's result; a
    ``KeyboardInterrupt`` or ``SystemExit`` is not (the window it cut short is left out), nor
    the ``NonFiniteLossError`` the Recorder raised once it had recorded the step."""
    if window is not None and isinstance(e, Exception) and not isinstance(e, NonFiniteLossError):
        rec.observe_end(window, values, exception=e)


def sched_count(s: Any) -> int:
    """How many times the scheduler ``s`` has stepped (its ``_step_count``, else ``last_epoch``)."""
    n = getattr(s, "_step_count", None)
    return int(n) if isinstance(n, int) else int(getattr(s, "last_epoch", 0))


def total_loss(losses: list[Any]) -> Any:
    """The step's loss: the sum of the micro-batch losses the framework's training step
    returned (each normalised for accumulation: the window's mean), in order, the same sum on
    replay."""
    total = None
    for v in losses:
        total = v if total is None else total + v
    return total

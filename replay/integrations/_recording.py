"""What the framework callbacks share: their recording lifecycle (the Recorder started, said so
when the run cannot be replayed, the window an exception broke recorded), counting a scheduler's
steps and summing a window's losses. Imports no framework."""

from __future__ import annotations

import functools
import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..errors import NonFiniteLossError, RecorderWarning
from ..record.recorder import Recorder
from ..store.tree import ObjectRecord, keep_kind, map_tree

__all__ = ["RecordingCallback", "clone_batch", "sched_count", "total_loss"]


def clone_batch(batch: Any, objects: Callable[[Any, ObjectRecord], Any] = keep_kind) -> Any:
    """A copy of a batch the training step cannot change under us (an in-place
    normalisation); ``objects`` rebuilds an object batch (``store.tree.map_tree``)."""
    return map_tree(
        lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, batch, objects
    )


class RecordingCallback:
    """The recording lifecycle both framework callbacks share: the Recorder (``None``: not
    recording), the window of micro-batches under way and their losses, the window an exception
    broke recorded with it, and the Recorder closed at the end."""

    def __init__(self, path: str, **recorder_kwargs: Any) -> None:
        self.path = path
        self.recorder_kwargs = recorder_kwargs
        self.rec: Recorder | None = None
        self._window: list[Any] | None = None
        self._losses: list[Any] = []

    def _start(self, start_step: int, **kwargs: Any) -> None:
        """A started :class:`Recorder` as ``rec``, its steps numbered from ``start_step``, or
        ``None`` (said once) when it cannot start: the recorder never takes training down. A
        run whose steps replay cannot rebuild (``not_replayable``: why) is said so once first."""
        if (why := kwargs.get("not_replayable")) is not None:
            warnings.warn(
                f"replay: {why}: replay cannot rebuild this run's steps; ReplayCallback records "
                "their health, batches and RNG states (no snapshots): replay info, doctor and "
                "tui read them, bisect names the first bad step without replaying it",
                RecorderWarning,
                stacklevel=3,
            )
        options = {"start_step": start_step, **self.recorder_kwargs}
        try:
            self.rec = Recorder(self.path, **kwargs, **options)
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            warnings.warn(
                f"replay: ReplayCallback records nothing ({type(e).__name__}: {e})",
                RecorderWarning,
                stacklevel=3,
            )
            return
        self.rec.__enter__()

    def _raised(self, values: dict[str, Any], e: BaseException) -> None:
        """The window under way when the framework's loop raised ``e``, recorded with it as
        ``Recorder.step`` records a step: an ``Exception`` is the step's result; a
        ``KeyboardInterrupt`` or ``SystemExit`` is not (the window it cut short is left out),
        nor the ``NonFiniteLossError`` the Recorder raised once it had recorded the step. Then
        the recording ends."""
        if self.rec is None:
            return
        window, self._window = self._window, None
        if (
            window is not None
            and isinstance(e, Exception)
            and not isinstance(e, NonFiniteLossError)
        ):
            self.rec.observe_end(window, values, exception=e)
        self._close(e)

    def _close(self, ended_by: BaseException | None = None) -> None:
        if self.rec is not None:
            self.rec.close(ended_by)
            self.rec = None


def sched_count(s: Any) -> int:
    """How many times the scheduler ``s`` has stepped (its ``_step_count``, else ``last_epoch``)."""
    n = getattr(s, "_step_count", None)
    return int(n) if isinstance(n, int) else int(getattr(s, "last_epoch", 0))


def total_loss(losses: list[Any]) -> Any:
    """The step's loss: the sum of the micro-batch losses the framework's training step
    returned (each normalised for accumulation: the window's mean), in order, the same sum on
    replay."""
    return functools.reduce(operator.add, losses) if losses else None

"""What the framework callbacks share: starting their Recorder, and saying what they record
when the run cannot be replayed. Imports no framework."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..errors import RecorderWarning
from ..record.recorder import Recorder
from ..store.tree import ObjectRecord, keep_kind, map_tree

__all__ = ["clone_batch", "start_recorder", "warn_not_replayable"]


def clone_batch(batch: Any, objects: Callable[[Any, ObjectRecord], Any] = keep_kind) -> Any:
    """A copy of a batch the training step cannot change under us (an in-place
    normalisation); ``objects`` rebuilds an object batch (``store.tree.map_tree``)."""
    return map_tree(
        lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, batch, objects
    )


def warn_not_replayable(why: str) -> None:
    """Said once at the start of a run whose steps replay cannot rebuild."""
    warnings.warn(
        f"replay: {why}: replay cannot rebuild this run's steps; ReplayCallback records their "
        "health, batches and RNG states (no snapshots): replay info, doctor and tui read them, "
        "bisect names the first bad step without replaying it",
        RecorderWarning,
        stacklevel=3,
    )


def start_recorder(path: str, **kwargs: Any) -> Recorder | None:
    """A started :class:`Recorder`, or ``None`` (said once) when it cannot start: the recorder
    never takes training down."""
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

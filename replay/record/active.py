"""The Recorder a ``replay.step`` call reaches: the newest one this process opened and has not
closed, so that a program which opens its Recorder where the run starts (``main()``) can hand
over each step where the step is (a ``train_one_epoch`` function), without passing the
Recorder down through every signature (docs/recording.md, "Where the step is").
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["opened", "closed", "current"]

_lock = threading.Lock()
_open: list[Any] = []  # the open Recorders, oldest first


def opened(recorder: Any) -> None:
    with _lock:
        _open.append(recorder)


def closed(recorder: Any) -> None:
    with _lock:
        _open[:] = [r for r in _open if r is not recorder]  # (each is opened once)


def current() -> Any | None:
    """The newest open Recorder of this process, or ``None``."""
    with _lock:
        return _open[-1] if _open else None

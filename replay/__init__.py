"""replay: a record-and-replay forensic debugger for PyTorch training.

``import replay`` is cheap; torch is imported when ``replay.Recorder`` is first used, so the
command line and the TUI start instantly.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    EntryPointError,
    NonFiniteLossError,
    RecorderWarning,
    RecordingError,
    ReplayError,
)

__version__ = "0.2.0"
__all__ = [
    "Recorder",
    "RecorderConfig",
    "ReplayError",
    "RecordingError",
    "EntryPointError",
    "NonFiniteLossError",
    "RecorderWarning",
    "replaying",
    "step",
    "__version__",
]


def replaying() -> bool:
    """True while ``replay`` runs this program again to replay its recording: everything before
    the Recorder runs again, then the Recorder replays and ends the program (docs/reentry.md).
    Use it to skip what a replay must not do again (a logging service, an upload)."""
    from .capture.guard import replaying as _replaying

    return _replaying()


def step(batch: Any, step_fn: Any = None, **values: Any) -> Any:
    """Hand one step to the Recorder this process has open (the newest one not closed), from
    wherever the step is: a program that opens its Recorder where the run starts need not pass
    it down to the function that runs each epoch. Example::

        def train_one_epoch(model, loader, optimizer):
            for batch in loader:
                def step(batch):              # a closure made again each epoch: the same step
                    ...
                    return loss
                replay.step(batch, step)

        with replay.Recorder("run.h5", objects={"model": model, "optimizer": optimizer}):
            for epoch in range(epochs):
                train_one_epoch(model, loader, optimizer)

    ``step_fn`` and ``values`` as :meth:`replay.Recorder.step` takes them; returns what the step
    returned. With no Recorder open, raises :class:`ReplayError` saying so.
    """
    from .record.active import current

    rec = current()
    if rec is None:
        raise ReplayError(
            "replay.step: no replay.Recorder is open in this process; open one where the run "
            'starts, `with replay.Recorder("run.h5", objects={...}):`, before the first step '
            "(docs/recording.md)"
        )
    return rec.step(batch, step_fn, **values)


def __getattr__(name: str) -> Any:
    if name == "Recorder":
        from .record.recorder import Recorder

        return Recorder
    if name == "RecorderConfig":
        from .record.config import RecorderConfig

        return RecorderConfig
    raise AttributeError(f"module 'replay' has no attribute {name!r}")

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
    "__version__",
]


def replaying() -> bool:
    """True while ``replay`` runs this program again to replay its recording: everything before
    the Recorder runs again, then the Recorder replays and ends the program (docs/reentry.md).
    Use it to skip what a replay must not do again (a logging service, an upload)."""
    from .capture.guard import replaying as _replaying

    return _replaying()


def __getattr__(name: str) -> Any:
    if name == "Recorder":
        from .record import Recorder

        return Recorder
    if name == "RecorderConfig":
        from .record.config import RecorderConfig

        return RecorderConfig
    raise AttributeError(f"module 'replay' has no attribute {name!r}")

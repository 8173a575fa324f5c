"""The interface the search drives. It knows nothing of HDF5 or torch: the replay engine provides
it for real recordings (``replay.engine.subject.EngineSubject``), tests provide synthetic ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["Subject", "Row"]

Row = dict[str, Any]  # "step" plus health columns; replayed rows add "exception" ({type, message})


class Subject(Protocol):
    window: tuple[int, int]  # replayable steps first..last (inclusive)
    snapshots: Sequence[int]  # snapshot steps inside the window, ascending (window[0] is one)
    device: str

    def recorded_rows(self) -> list[Row]:
        """Every recorded health row, ascending by step (may start before the window)."""

    def recorded_exception(self, step: int) -> dict[str, Any] | None:
        """The exception recorded at ``step`` ({type, message, ...}) or None."""

    def snapshot_healthy(self, step: int) -> bool:
        """Whether every tensor of the snapshot at ``step`` is finite."""

    def replay(self, step: int, *, keep: bool = True, fresh: bool = False) -> Row:
        """Replay ``step`` from the state right before it (reached as cheaply as possible); with
        ``keep``, remember that state so ``replay_again(step)`` can start from it; with
        ``fresh``, from the newest snapshot at or before it, never from a replay carried on."""

    def replay_again(self, step: int) -> Row:
        """Replay ``step`` a second time from the same state as the last ``replay(step)``."""

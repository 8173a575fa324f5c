"""The engine seen through the bisector's :class:`replay.bisect.subject.Subject` interface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .engine import Engine

__all__ = ["EngineSubject"]


class EngineSubject:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        w = engine.window
        self.window = (w.first, w.last)
        self.snapshots: Sequence[int] = list(w.snapshots)
        self.device = engine.device

    def recorded_rows(self) -> list[dict[str, Any]]:
        return self.engine.recorded_rows()

    def recorded_exception(self, step: int) -> dict[str, Any] | None:
        try:
            return self.engine.recorded_exception(step)
        except Exception:  # noqa: BLE001 - a step record that rolled out: nothing to compare
            return None

    def snapshot_healthy(self, step: int) -> bool:
        return self.engine.snapshot_finite(step)

    def replay(self, step: int, *, keep: bool = True, fresh: bool = False) -> dict[str, Any]:
        self.engine.state_before(step, keep=keep, fresh=fresh)
        return self.engine.run_step(step).row()

    def replay_again(self, step: int) -> dict[str, Any]:
        self.engine.state_before(step, keep=True)  # from the in-memory state kept by replay()
        return self.engine.run_step(step).row()

"""``OverfitReport``: ``replay overfit --json``, one recorded batch trained on again and again."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .verdict import known

__all__ = ["OverfitReport"]


@dataclass
class OverfitReport:
    """The loss curve of step ``step``'s batch trained on ``iters`` times and what it says.

    ``verdict``: ``overfits``, ``close``, ``still_falling``, ``plateau`` or ``error``
    (``replay.workflows.overfit.judge``); ``overfits`` is true for the first three. Losses are
    plain floats (NaN when none was measured)."""

    path: str
    step: int
    iters: int  # iterations run (fewer than asked when the step failed)
    lr: float | None
    first_loss: float
    final_loss: float
    min_loss: float
    goal: float
    overfits: bool
    verdict: str
    progress: float | None  # share of the way from the first loss to the goal
    recent_drop: float | None  # how much the last quarter lowered the loss
    reached_at: int | None  # the iteration that reached the goal
    error: str | None
    curve: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OverfitReport:
        return cls(**known(cls, d))

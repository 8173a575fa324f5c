"""``replay verify``: replay the whole replayable window and compare every step bitwise."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..reports.divergence import Divergence
from .compare import compare_replays, compare_rows, with_exception_type
from .subject import Subject

__all__ = ["WindowCheck", "verify_window"]


@dataclass
class WindowCheck:
    """Every step of the window replayed, beside its recorded row (``replay.reports.VerifyReport``
    is what ``replay verify`` prints of it)."""

    window: tuple[int, int]
    device: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    replayed_steps: int = 0

    @property
    def divergences(self) -> list[Divergence]:
        return [s["divergence"] for s in self.steps if s["divergence"] is not None]

    @property
    def deterministic(self) -> bool:
        return not self.divergences

    @property
    def first_divergence(self) -> Divergence | None:
        return next(iter(self.divergences), None)

    def replayed_exception(self, step: int) -> dict[str, Any] | None:
        return next((s["exception"] for s in self.steps if s["step"] == step), None)


def verify_window(
    subject: Subject,
    *,
    progress: Callable[[int, int], None] | None = None,
    start: int | None = None,
) -> WindowCheck:
    """Replay every step of the window (from ``start``'s snapshot, the newest at or before it,
    when given) and compare each with the recording."""
    first, last = subject.window
    if start is not None:
        first = max([s for s in subject.snapshots if s <= max(start, first)], default=first)
    rep = WindowCheck((first, last), subject.device)
    by_step = {int(r["step"]): r for r in subject.recorded_rows()}
    total = last - first + 1
    # Each kept snapshot inside the window starts its steps afresh, as a bisect of a failure
    # after it would. Its step is first replayed carried on from the step before, too: a step
    # that reads state the loop keeps outside the recorded objects (a batch the previous step
    # prefetched into a global) matches the recording carried on, but not from the snapshot,
    # and the divergence says so (``carried_on``: the snapshot the matching replay came from).
    restarts = {s for s in subject.snapshots if first < s <= last}
    for i, t in enumerate(range(first, last + 1)):
        recorded = with_exception_type(by_step.get(t), subject.recorded_exception)
        carried = subject.replay(t, keep=False) if t in restarts else None
        replayed = subject.replay(t, keep=False, fresh=t in restarts)
        rep.replayed_steps += 1
        if progress is not None:
            progress(i + 1, total)
        divergence = compare_rows(recorded, replayed)
        if carried is not None and compare_rows(recorded, carried) is None:
            divergence = divergence or compare_replays(carried, replayed)
            if divergence is not None:
                divergence = replace(
                    divergence, carried_on=max(s for s in subject.snapshots if s < t)
                )
        rep.steps.append(
            {
                "step": t,
                "recorded": None if recorded is None else _measured(recorded),
                "replayed": _measured(replayed),
                "exception": replayed.get("exception"),
                "divergence": divergence,
                "compared": recorded is not None,
            }
        )
    return rep


def _measured(row: dict[str, Any]) -> dict[str, Any]:
    """The step's loss and parameter fingerprint; the loss ``None`` where the step returned none
    (the column's NaN then marks an absent value, as ``loss_nonfinite`` says; ``verify --json``
    said ``"nan"`` for such steps)."""
    flag = row.get("loss_nonfinite")
    loss = None if isinstance(flag, float) and math.isnan(flag) else row.get("loss")
    return {"loss": loss, "param_fingerprint": row.get("param_fingerprint")}

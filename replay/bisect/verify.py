"""``replay verify``: replay the whole replayable window and compare every step bitwise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .compare import compare_rows
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
    def divergences(self) -> list[dict[str, Any]]:
        return [s["divergence"] for s in self.steps if s["divergence"] is not None]

    @property
    def deterministic(self) -> bool:
        return not self.divergences

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        d = self.divergences
        return d[0] if d else None

    def replayed_exception(self, step: int) -> dict[str, Any] | None:
        return next((s["exception"] for s in self.steps if s["step"] == step), None)


def verify_window(
    subject: Subject,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> WindowCheck:
    first, last = subject.window
    rep = WindowCheck((first, last), subject.device)
    by_step = {int(r["step"]): r for r in subject.recorded_rows()}
    total = last - first + 1
    for i, t in enumerate(range(first, last + 1)):
        replayed = subject.replay(t, keep=False)
        rep.replayed_steps += 1
        if progress is not None:
            progress(i + 1, total)
        recorded = by_step.get(t)
        if recorded is not None and recorded.get("raised") == 1.0:
            exc = subject.recorded_exception(t) or {}
            recorded = {**recorded, "exception_type": exc.get("type")}
        rep.steps.append(
            {
                "step": t,
                "recorded": None
                if recorded is None
                else {
                    "loss": recorded.get("loss"),
                    "param_fingerprint": recorded.get("param_fingerprint"),
                },
                "replayed": {
                    "loss": replayed.get("loss"),
                    "param_fingerprint": replayed.get("param_fingerprint"),
                },
                "exception": replayed.get("exception"),
                "divergence": compare_rows(recorded, replayed),
                "compared": recorded is not None,
            }
        )
    return rep

"""What a :class:`~replay.Recorder` is told: how often to snapshot, how much to keep, when
training waits for the writer. One validated value, read by the recorder and written into the
file's run metadata (``meta.config``, docs/format.md) as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..capture.guard import Preflight
from ..store.contracts import RunConfig
from ..store.retention import ReachPlan, plan

__all__ = ["RecorderConfig"]


@dataclass(frozen=True)
class RecorderConfig:
    """The :class:`~replay.Recorder`'s settings (its keyword arguments of the same names)."""

    snapshot_every: int = 50
    fingerprint_every: int = 10
    keep_snapshots: int = 3
    # steps back from the newest that stay replayable (docs/recording.md, "Reach"); 0: only
    # the dense tier (keep_snapshots * snapshot_every steps)
    reach: int = 10_000
    # at most this many bytes of step records (batches, RNG states): a larger batch shortens
    # the reach, which the file states (meta/run.reach)
    keep_bytes: int = 1 << 30
    keep_health: int = 100_000
    raise_on_nonfinite: bool = True
    start_step: int = 0
    max_pending_bytes: int = 1 << 30
    max_pending_steps: int = 64
    max_pending_seconds: float = 1.0
    handle_signals: bool = True
    # the background self-check (docs/selfcheck.md): on, after how many steps, up to what state
    self_check: bool = True
    self_check_steps: int = 4
    self_check_budget: int = 2 << 30

    def __post_init__(self) -> None:
        if self.snapshot_every < 1 or self.keep_snapshots < 2:
            raise ValueError("snapshot_every must be >= 1 and keep_snapshots >= 2")
        if self.reach < 0 or self.keep_bytes < 0:
            raise ValueError("reach and keep_bytes must be >= 0")
        if self.fingerprint_every < 1:
            object.__setattr__(self, "fingerprint_every", 1)

    def plan(self, step_bytes: int = 0) -> ReachPlan:
        """The rings' sizes and the snapshots kept, for step records of ``step_bytes``."""
        return plan(
            snapshot_every=self.snapshot_every,
            keep_snapshots=self.keep_snapshots,
            reach=self.reach,
            start=self.start_step,
            step_bytes=step_bytes,
            budget=self.keep_bytes,
        )

    def health_slots(self, step_slots: int) -> int:
        return max(self.keep_health, step_slots)

    def for_preflight(self, preflight: Preflight | None) -> RecorderConfig:
        """``replay preflight`` records a few steps: two snapshots inside them (the second one
        is where state changed outside the step shows) and a fingerprint at every step."""
        if preflight is None:
            return self
        return replace(
            self,
            snapshot_every=max(1, preflight.steps // 2),
            keep_snapshots=max(self.keep_snapshots, 3),
            reach=0,
            fingerprint_every=1,
        )

    def is_snapshot_step(self, t: int) -> bool:
        return (t - self.start_step) % self.snapshot_every == 0

    def is_fingerprint_step(self, t: int) -> bool:
        return (t - self.start_step) % self.fingerprint_every == 0

    def meta(self, p: ReachPlan) -> RunConfig:
        """``meta.config`` of the file (docs/format.md), its rings sized by ``p``."""
        return {
            "snapshot_every": self.snapshot_every,
            "fingerprint_every": self.fingerprint_every,
            "keep_snapshots": self.keep_snapshots,
            "snapshot_slots": p.snapshot_slots,
            "reach": self.reach,
            "keep_bytes": self.keep_bytes,
            "step_slots": p.step_slots,
            "health_slots": self.health_slots(p.step_slots),
            "start_step": self.start_step,
            "raise_on_nonfinite": self.raise_on_nonfinite,
        }

"""What a :class:`~replay.Recorder` is told: how often to snapshot, how much to keep, when
training waits for the writer. One validated value, read by the recorder and written into the
file's run metadata (``meta.config``, docs/format.md) as it is.

This class is the only list of the settings: ``Recorder(..., snapshot_every=20)`` and the
framework integrations' ``**kwargs`` reach it by name (:meth:`RecorderConfig.of`).
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

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

    @classmethod
    def of(cls, base: RecorderConfig | None, settings: Mapping[str, Any]) -> RecorderConfig:
        """``base`` (the defaults when ``None``) with ``settings`` by name: a name that is not a
        setting is refused, naming the closest one."""
        known = [f.name for f in fields(cls)]
        for name in settings:
            if name not in known:
                near = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise TypeError(
                    f"Recorder() got an unexpected keyword argument {name!r}{hint} (settings: "
                    f"{', '.join(known)}; replay.RecorderConfig)"
                )
        return replace(base if base is not None else cls(), **settings)

    def __post_init__(self) -> None:
        # Plain python values (they go into the file's JSON metadata as they are): a numpy
        # integer is taken as an int, 0/1 as a bool; a string or a fraction is refused.
        for f in fields(self):
            v, kind = getattr(self, f.name), str(f.type)  # "int", "float" or "bool"
            if kind == "bool" and v in (0, 1) and isinstance(v, numbers.Integral):
                object.__setattr__(self, f.name, bool(v))
            elif kind == "int" and isinstance(v, numbers.Integral) and not isinstance(v, bool):
                object.__setattr__(self, f.name, int(v))
            elif kind == "float" and isinstance(v, numbers.Real) and not isinstance(v, bool):
                object.__setattr__(self, f.name, float(v))
            else:
                raise TypeError(
                    f"Recorder setting {f.name}={v!r}: expected {kind}, got {type(v).__name__}"
                )
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

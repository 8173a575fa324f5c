"""``Divergence``: where a replayed step first differs from its recording (bisect, verify,
whatif, each rank replayed together) or from another replay of it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..jsonsafe import json_safe
from .verdict import known

__all__ = ["Divergence"]

_NUMBERS = ("recorded", "replayed", "abs_diff")  # non-finite ones as "nan", "inf", "-inf"


@dataclass(frozen=True)
class Divergence:
    """Step ``step``'s ``column`` (``loss``, ``param_fingerprint``, ``exception``...) was
    ``recorded`` in the recording and ``replayed`` on replay (exception type names for
    ``exception``); ``abs_diff`` and ``ulps`` when both are finite numbers (``ulps`` counted in
    float32 when both are float32 values, as a float32 loss is). ``carried_on``: the snapshot a
    replay carried on from gave the recorded bits, one from the step's own snapshot did not
    (``replay verify``)."""

    step: int
    column: str
    recorded: float | str | None
    replayed: float | str | None
    abs_diff: float | None = None
    ulps: int | None = None
    carried_on: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON of every report that names one (``carried_on`` only when set)."""
        out = asdict(self) | {k: json_safe(getattr(self, k)) for k in _NUMBERS}
        if self.carried_on is None:
            del out["carried_on"]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Divergence | None:
        """One read back (``None``: none)."""
        return None if d is None else cls(**known(cls, d))

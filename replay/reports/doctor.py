"""``DoctorReport``: ``replay doctor --json``, the checklist's findings over one recording, and
``RankSetDoctorReport`` over every rank of a DDP rank set."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeAlias

from ..jsonsafe import json_safe
from .verdict import known

__all__ = ["DoctorReport", "Evidence", "Finding", "RankSetDoctorReport", "SlowestRank"]

# A finding's numbers under its own names (each rule has its own: a loss's medians, a layer's
# fractions, the steps that show it), in the shapes JSON holds.
EvidenceValue: TypeAlias = (
    str | float | None | Sequence["EvidenceValue"] | Mapping[str, "EvidenceValue"]
)
Evidence: TypeAlias = Mapping[str, EvidenceValue]


@dataclass
class Finding:
    """One diagnosis: what is wrong, the numbers that show it, and what to do about it."""

    rule: str
    severity: str  # error, warning, info
    title: str
    evidence: Evidence
    advice: str
    steps: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Non-finite evidence as ``"nan"``, ``"inf"``, ``"-inf"``."""
        out: dict[str, Any] = json_safe(asdict(self))
        return out

    def evidence_text(self, num: Callable[[float], str]) -> str:
        """The evidence in one line, as ``replay doctor`` and the report page show it: floats
        through ``num``, the first 4 entries of a mapping and 6 items of a list."""
        return "; ".join(f"{k} {_value_text(v, num)}" for k, v in self.evidence.items())

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finding:
        return cls(**known(cls, d))


def _value_text(v: EvidenceValue, num: Callable[[float], str]) -> str:
    if isinstance(v, float):
        return num(v)
    if isinstance(v, dict):
        items = list(v.items())
        s = ", ".join(f"{k}={_value_text(x, num)}" for k, x in items[:4])
        return "{" + s + (", ..." if len(items) > 4 else "") + "}"
    if isinstance(v, list):
        s = ", ".join(_value_text(x, num) for x in v[:6])
        return "[" + s + (", ..." if len(v) > 6 else "") + "]"
    return str(v)


@dataclass
class DoctorReport:
    """The findings over the recording ``path``; its JSON is the list of findings."""

    path: str
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.findings]

    @classmethod
    def from_json(cls, path: str, d: list[dict[str, Any]]) -> DoctorReport:
        return cls(path, [Finding.from_json(f) for f in d])


@dataclass
class SlowestRank:
    """The rank whose median step took longest, beside the others' median."""

    rank: int
    median_step_s: float
    others_median_step_s: float


@dataclass
class RankSetDoctorReport:
    """Across the ranks: which went bad first (``first_bad`` says it in a sentence), which is
    slow; and every rank's own findings (``ranks``, by rank number as a string)."""

    world_size: int | None
    missing: list[int]
    first_bad: str
    first_bad_step: int | None
    first_bad_ranks: list[int]
    slowest: SlowestRank | None
    ranks: dict[str, DoctorReport] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        ranks = {r: d.to_json() for r, d in self.ranks.items()}
        out: dict[str, Any] = json_safe(asdict(self) | {"ranks": ranks})
        return out

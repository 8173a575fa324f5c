"""``VerifyReport``: ``replay verify --json``, every step of the window compared bitwise."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .cause import DivergenceCause
from .divergence import Divergence
from .ranks import MultiRankRun, RankReplay, json_of, ranks_from_json, ranks_json
from .verdict import ExceptionInfo, exception_info, known

__all__ = ["VerifiedStep", "VerifyReport"]

_UNLESS_SET = ("approximate", "notes", "multi_rank", "ranks")  # in the JSON only when set


@dataclass
class VerifiedStep:
    """One replayed step beside its recorded values (``recorded_*`` ``None``: not recorded;
    non-finite numbers as ``"nan"``, ``"inf"``, ``"-inf"``)."""

    step: int
    match: bool
    compared: bool  # the recording held the step's row
    loss: float | str | None
    recorded_loss: float | str | None
    param_fingerprint: float | str | None
    recorded_param_fingerprint: float | str | None
    exception: ExceptionInfo | None  # what the replay raised

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VerifiedStep:
        exc = exception_info(d.get("exception"))
        return cls(**{"compared": True, **known(cls, d), "exception": exc})


@dataclass(kw_only=True)
class VerifyReport:
    """``deterministic``: every step matched (on every rank, replayed together).
    ``first_divergence``: step, column, recorded, replayed, abs_diff, ulps; ``cause``: why.

    Present in the JSON only when set: ``approximate`` and ``notes`` (one rank of a rank set
    replayed alone), ``multi_rank`` and ``ranks`` (every rank replayed together)."""

    deterministic: bool
    window: list[int]  # [first, last]
    device: str
    replayed_steps: int
    first_divergence: Divergence | None = None
    steps: list[VerifiedStep] = field(default_factory=list)
    cause: DivergenceCause | None = None
    recording: str = ""
    entry_files: list[str] = field(default_factory=list)
    approximate: bool = False
    notes: list[str] | None = None
    multi_rank: MultiRankRun | None = None
    ranks: dict[str, RankReplay] | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self) | {
            "window": list(self.window),
            "first_divergence": json_of(self.first_divergence),
            "cause": None if self.cause is None else self.cause.to_json(),
            "approximate": self.approximate or None,
            "ranks": ranks_json(self.ranks),
        }
        return {k: v for k, v in out.items() if v is not None or k not in _UNLESS_SET}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VerifyReport:
        cause = d.get("cause")
        typed = {
            "first_divergence": Divergence.from_json(d.get("first_divergence")),
            "steps": [VerifiedStep.from_json(s) for s in d.get("steps") or []],
            "cause": None if cause is None else DivergenceCause.from_json(cause),
        }
        return cls(**{**known(cls, d), **ranks_from_json(d), **typed})

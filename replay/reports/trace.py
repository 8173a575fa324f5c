"""``TraceReport``: ``replay trace --json``, one step traced per op."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .culprit import TracedOp
from .ranks import MultiRankRun, RankReplay, RankSet, json_of, ranks_from_json, ranks_json
from .verdict import known

__all__ = ["TraceReport"]


@dataclass(kw_only=True)
class TraceReport(TracedOp):
    """The traced ``step`` of ``recording`` (replayable ``window``), and what the trace named:
    on a healthy step ``op`` is ``None`` and the sidecar holds every op for ``replay tui``."""

    recording: str = ""
    step: int = 0
    window: list[int] = field(default_factory=list)  # [first, last]
    # every rank of a DDP rank set traced together: the leading rank, the set, each rank's check
    deterministic: bool | None = None
    rank: int | None = None
    rank_set: RankSet | None = None
    multi_rank: MultiRankRun | None = None
    ranks: dict[str, RankReplay] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "recording": self.recording,
            "step": self.step,
            "window": list(self.window),
            **self.culprit_json(),
            "trace_notes": list(self.trace_notes),
            "forensics": self.forensics,
        }
        if self.traced_loss is not None:
            out["traced_loss"] = self.traced_loss
        together = {
            "deterministic": self.deterministic,
            "rank": self.rank,
            "rank_set": json_of(self.rank_set),
            "multi_rank": json_of(self.multi_rank),
            "ranks": ranks_json(self.ranks),
        }
        out.update({k: v for k, v in together.items() if v is not None})
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TraceReport:
        return cls(**{**known(cls, d), **ranks_from_json(d)})

    @classmethod
    def of(cls, recording: str, step: int, window: list[int], traced: TracedOp) -> TraceReport:
        r = cls(recording=recording, step=step, window=list(window))
        r.take_culprit(traced)
        r.trace_notes, r.traced_loss = list(traced.trace_notes), traced.traced_loss
        return r

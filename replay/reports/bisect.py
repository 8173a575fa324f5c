"""``BisectReport``: ``replay bisect --json``, the first bad step, why, whether it reproduces."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..jsonsafe import json_safe
from .cause import DivergenceCause
from .culprit import Culprit, TracedOp
from .divergence import Divergence
from .ranks import MultiRankRun, RankReplay, RankSet, json_of, ranks_from_json, ranks_json
from .verdict import Ended, ExceptionInfo, TraceVerdict, exception_info, known

__all__ = ["BisectReport"]

# the culprit's keys in the bisect report, in the verdict's order (docs/forensics.md, /verdict)
_CULPRIT_ORDER = tuple(
    f.name for f in fields(TraceVerdict) if f.name in Culprit.__dataclass_fields__
)


@dataclass(kw_only=True)
class BisectReport(Culprit):
    """The bisector's verdict (what ``replay.bisect.find_culprit`` found), what the per-op trace
    of the first bad step named (:class:`Culprit`, ``None`` until traced) and why the replay differs from the
    recording when it does (``divergence_cause``).

    Present in the JSON only when set: ``rank_set`` (``run`` named a DDP rank set),
    ``traced_loss`` (the traced step's loss was not finite), ``approximate`` (one rank replayed
    alone), and for every rank replayed together ``rank`` (the leader), ``multi_rank`` and
    ``ranks`` (each rank's own check, ``replay.multirank``)."""

    healthy: bool = False
    kind: str = ""
    criterion: str = ""
    first_bad_step: int | None = None
    symptom_step: int | None = None
    exception: ExceptionInfo | None = None
    deterministic: bool | None = None
    reproducible: bool | None = None
    divergence: Divergence | None = None  # the first step that differs from the recording
    replayed_steps: int = 0
    rechecked_steps: int = 0
    snapshot: int | None = None
    snapshots_checked: int = 0
    device: str = ""
    window: list[int] = field(default_factory=list)  # [first, last]
    checked: list[int] | None = None  # the health rows examined, [first, last]
    loss: float | str | None = None
    grad_norm: float | str | None = None
    notes: list[str] = field(default_factory=list)
    divergence_cause: DivergenceCause | None = None
    recording: str = ""
    ended: Ended | None = None  # the program raised outside any step (the file's /ended)
    entry_files: list[str] = field(default_factory=list)
    rank_set: RankSet | None = None
    traced_loss: str | None = None
    approximate: bool = False
    rank: int | None = None
    multi_rank: MultiRankRun | None = None
    ranks: dict[str, RankReplay] | None = None

    def take_row(self, row: dict[str, Any]) -> None:
        """The first bad step's health as replayed: its loss and gradient norm."""
        self.loss, self.grad_norm = json_safe(row.get("loss")), json_safe(row.get("grad_norm"))

    def take_trace(self, traced: TracedOp) -> None:
        """The trace of the first bad step: its culprit, its notes (after the bisector's own,
        none twice) and its non-finite loss."""
        self.take_culprit(traced)
        self.notes += [n for n in traced.trace_notes if n not in self.notes]
        self.traced_loss = traced.traced_loss

    def to_json(self) -> dict[str, Any]:
        culprit = self.culprit_json()
        out: dict[str, Any] = {
            "healthy": self.healthy,
            "kind": self.kind,
            "criterion": self.criterion,
            "first_bad_step": self.first_bad_step,
            "symptom_step": self.symptom_step,
            "exception": None if self.exception is None else dict(self.exception),
            "deterministic": self.deterministic,
            "reproducible": self.reproducible,
            "divergence": None if self.divergence is None else self.divergence.to_json(),
            "replayed_steps": self.replayed_steps,
            "rechecked_steps": self.rechecked_steps,
            "snapshot": self.snapshot,
            "snapshots_checked": self.snapshots_checked,
            "device": self.device,
            "window": list(self.window),
            "checked": None if self.checked is None else list(self.checked),
            "loss": json_safe(self.loss),
            "grad_norm": json_safe(self.grad_norm),
            **{k: culprit[k] for k in _CULPRIT_ORDER},
            "forensics": self.forensics,
            "notes": list(self.notes),
            "divergence_cause": (
                None if self.divergence_cause is None else self.divergence_cause.to_json()
            ),
            "recording": self.recording,
            "entry_files": list(self.entry_files),
        }
        # in the order each replay adds them: one process, or every rank together (led by rank)
        optional = {"rank_set": json_of(self.rank_set)} if self.rank is None else {}
        optional |= {"traced_loss": self.traced_loss, "approximate": self.approximate or None}
        if self.rank is not None:
            optional |= {
                "rank": self.rank,
                "rank_set": json_of(self.rank_set),
                "multi_rank": json_of(self.multi_rank),
                "ranks": ranks_json(self.ranks),
            }
        out.update({k: v for k, v in optional.items() if v is not None})
        if self.ended is not None:  # (present only when the program raised outside any step)
            out["ended"] = asdict(self.ended)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BisectReport:
        """Read a report back; keys it lacks keep their defaults (a partial report renders)."""
        cause = d.get("divergence_cause")
        typed = {
            "exception": exception_info(d.get("exception")),
            "divergence": Divergence.from_json(d.get("divergence")),
            "divergence_cause": None if cause is None else DivergenceCause.from_json(cause),
            "ended": Ended.from_json(d.get("ended")),
        }
        return cls(**{**known(cls, d), **ranks_from_json(d), **typed})

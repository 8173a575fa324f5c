"""``DivergenceCause``: why a replay differs from its recording (``replay/workflows/why.py``
runs the experiments), as ``replay verify`` and ``replay bisect`` report it (``cause``,
``divergence_cause``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..jsonsafe import json_safe
from .verdict import ExceptionInfo, exception_info, known

__all__ = ["DivergenceCause", "StateDrift"]


@dataclass
class StateDrift:
    """One object whose replayed state differs from the snapshot recorded at the same step."""

    object: str  # "model parameters", "module buffers", "optimizer", a named object...
    names: list[str]  # the first few differing entries
    count: int  # how many differ
    max_abs_diff: float | None  # over the floating ones; None when none is comparable

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {
            "names": list(self.names),
            "max_abs_diff": json_safe(self.max_abs_diff),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StateDrift:
        size = d.get("max_abs_diff")  # non-finite ones as "nan", "inf", "-inf"
        return cls(**{**known(cls, d), "max_abs_diff": None if size is None else float(size)})


@dataclass
class DivergenceCause:
    """``kind``: ``raised`` (the replay raised where the recording did not, or the reverse),
    ``nondeterministic`` (two replays from the same state disagree) or ``outside_state`` (they
    agree with each other, not with the recording). ``summary`` says it in a sentence,
    ``hint`` what to do. Absent from the JSON when ``None``: ``snapshot`` (the later snapshot
    the state was compared with), ``differs`` (the objects that drifted, from that comparison)
    ``exception`` (what the replay raised) and ``suspects`` (the objects the step's code reaches
    and changes that no snapshot holds, described)."""

    step: int
    kind: str = "outside_state"
    summary: str = ""
    hint: str = ""
    changed_files: list[str] = field(default_factory=list)  # entry files edited since recording
    snapshot: int | None = None
    differs: list[StateDrift] | None = None
    exception: ExceptionInfo | None = None
    # state the step changes that no snapshot holds (capture/suspects.py), described
    suspects: list[str] | None = None
    # the environment variables that differ from the recorded run's (capture/environ.py)
    changed_environ: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "changed_files": list(self.changed_files)}
        if self.snapshot is not None:
            out["snapshot"] = self.snapshot
        if self.differs is not None:
            out["differs"] = [d.to_json() for d in self.differs]
        out.update(kind=self.kind, summary=self.summary, hint=self.hint)
        if self.exception is not None:
            out["exception"] = dict(self.exception)
        if self.suspects is not None:
            out["suspects"] = list(self.suspects)
        if self.changed_environ is not None:
            out["changed_environ"] = list(self.changed_environ)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DivergenceCause:
        differs = d.get("differs")
        typed = {
            "differs": None if differs is None else [StateDrift.from_json(x) for x in differs],
            "exception": exception_info(d.get("exception")),
        }
        return cls(**{**known(cls, d), **typed})

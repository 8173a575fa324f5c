"""``TracedOp``: what the per-op trace of one step names, the fields ``replay bisect`` and
``replay trace`` report for it (a subset of :class:`TraceVerdict`, plus where the sidecar is)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .verdict import JSONObject, SourceLine, TraceVerdict

__all__ = ["Culprit", "TracedOp"]


@dataclass(kw_only=True)
class Culprit:
    """The op a trace names and why (``docs/forensics.md``, ``/verdict``, same keys), and the
    forensics sidecar it was written to. All ``None`` until a trace ran."""

    cause: str | None = None
    op_index: int | None = None
    op: str | None = None
    phase: str | None = None
    module: str | None = None
    source: SourceLine | None = None
    # where a backward op ran when that was the program's own code (a custom
    # autograd.Function's backward); ``source`` is then the forward line that made its node
    executed_at: SourceLine | None = None
    made: str | None = None
    made_from: str | None = None
    nan_from_inf: JSONObject | None = None
    closure: int | None = None
    surfaced: JSONObject | None = None
    data: JSONObject | None = None
    samples: list[Any] | None = None
    samples_exact: bool | None = None
    sample_axes: list[int] | None = None
    sample_sources: list[JSONObject] | None = None
    forensics: str | None = None

    def culprit_json(self) -> dict[str, Any]:
        """The culprit's keys, in the order ``replay trace --json`` prints them."""
        return {f.name: getattr(self, f.name) for f in fields(Culprit) if f.name != "forensics"}

    def take_culprit(self, other: Culprit) -> None:
        """Copy ``other``'s culprit fields into this report."""
        for f in fields(Culprit):
            setattr(self, f.name, getattr(other, f.name))


@dataclass(kw_only=True)
class TracedOp(Culprit):
    """What tracing one step found: the culprit, the trace's own notes, and the loss of the
    traced step when it was not finite (``"nan"``, ``"inf"``, ``"-inf"``)."""

    trace_notes: list[str] = field(default_factory=list)
    traced_loss: str | None = None

    @classmethod
    def from_verdict(
        cls, v: TraceVerdict, forensics: str, traced_loss: str | None = None
    ) -> TracedOp:
        """The verdict's culprit fields (a :class:`TraceVerdict` has each of them)."""
        culprit = {f.name: getattr(v, f.name) for f in fields(Culprit) if f.name != "forensics"}
        return cls(
            **culprit, forensics=forensics, trace_notes=list(v.notes), traced_loss=traced_loss
        )

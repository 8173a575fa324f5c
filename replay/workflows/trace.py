"""Trace any step of a recording per op, healthy or not, and write the forensics sidecar."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine import Engine
    from ..store.reader import Recording

from ..errors import UsageError
from ..ranks.scan import rank_set
from ..reports import TraceReport
from ..reports.verdict import only_known
from .session import AS_RECORDED, ReplayOptions, together, with_engine

__all__ = ["run_trace", "trace_engine"]


def run_trace(
    run: str, step: int | None = None, options: ReplayOptions = AS_RECORDED
) -> TraceReport:
    """Replay ``step`` (default: the last replayable one) under the per-op tracer.

    Returns the fields ``replay bisect`` fills for its culprit (``op``, ``phase``, ``module``,
    ``source``, ``forensics``...) plus ``step`` and ``window``; on a healthy step
    ``op`` is ``None`` and the sidecar holds every op of the step for ``replay tui``.
    """
    files = rank_set(run)
    if files is not None:  # a DDP rank set: every rank together, each traced into its sidecar
        d = together(files, "trace", options, step=step)
        return TraceReport.from_json(only_known(TraceReport, d))

    def check(rec: Recording) -> None:  # before the program runs again
        w = rec.replayable_window()
        if w is not None and step is not None and step not in w:
            raise UsageError(w.outside(f"--step {step}"))

    return with_engine(
        run, lambda rec, eng: trace_engine(rec, eng, run, step), options, check=check
    )


def trace_engine(rec: Recording, engine: Engine, run: str, step: int | None) -> TraceReport:
    """What :func:`run_trace` does with the engine up (a multi-rank replay's leader runs it)."""
    from .culprit import trace_culprit

    w = engine.window
    t = w.last if step is None else step
    if t not in w:
        raise UsageError(w.outside(f"--step {t}"))
    return TraceReport.of(run, t, [w.first, w.last], trace_culprit(engine, rec, t, "trace"))

"""Trace any step of a recording per op, healthy or not, and write the forensics sidecar."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .session import open_engine

__all__ = ["run_trace"]


def run_trace(
    run: str,
    step: int | None = None,
    *,
    device: str | None = None,
    entry: str | None = None,
    trust: bool = False,
) -> dict[str, Any]:
    """Replay ``step`` (default: the last replayable one) under the per-op tracer.

    Returns the report fields ``replay bisect`` fills for its culprit (``op``, ``phase``,
    ``module``, ``source``, ``forensics``...) plus ``step`` and ``window``; on a healthy step
    ``op`` is ``None`` and the sidecar holds every op of the step for ``replay tui``.
    """
    from ..engine.culprit import trace_culprit

    rec, engine = open_engine(run, device, entry, trust)
    try:
        w = engine.window
        t = w.last if step is None else step
        if t not in w:
            raise UsageError(
                f"--step {t} is outside the replayable window (steps {w.first}..{w.last})"
            )
        out = trace_culprit(
            engine, t, "trace", forensics_path=rec.forensics_path, run_id=rec.run_id
        )
    finally:
        engine.close()
        rec.close()
    return {"recording": run, "step": t, "window": [w.first, w.last], **out}

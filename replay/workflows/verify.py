"""Replay a recording's whole window and compare every step bitwise; when one differs, say why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .session import open_engine

__all__ = ["run_verify"]


def run_verify(
    run: str,
    *,
    device: str | None = None,
    entry: str | None = None,
    trust: bool = False,
    progress: Callable[[int, int], None] | None = None,
    opened: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """The ``replay verify --json`` report of ``run`` (``deterministic``, ``steps``, ``cause``...).

    ``opened`` is called once the engine is up (user code imported and built), before the
    replay: the command uses it to end its start-up phase.
    """
    from ..bisect import verify_window
    from ..bisect.report import verify_json
    from ..engine.subject import EngineSubject
    from ..engine.why import explain_divergence

    rec, engine = open_engine(run, device, entry, trust)
    try:
        if opened is not None:
            opened()
        report = verify_window(EngineSubject(engine), progress=progress)
        fd = report.first_divergence
        if fd is not None:
            report.cause = explain_divergence(
                engine, fd, report.replayed_exception(int(fd["step"]))
            )
    finally:
        engine.close()
        rec.close()
    return verify_json(report, recording=run, entry_files=engine.entry_files)

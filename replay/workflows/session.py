"""Opening a recording and starting the replay engine on it (torch is imported here)."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError

__all__ = ["open_engine", "parse_entry"]


def parse_entry(entry: str | None) -> Any:
    """``--entry MODULE_OR_FILE:build,step`` as an ``EntryOverride``; a bad one is a usage error."""
    if entry is None:
        return None
    from ..engine.entry import parse_entry_override

    try:
        return parse_entry_override(entry)
    except ValueError as e:
        raise UsageError(str(e)) from None


def open_engine(
    run: str, device: str | None = None, entry: str | None = None, trust: bool = False
) -> tuple[Any, Any]:
    """``(recording, engine)``: the recording opened, the entry points imported, the objects
    built. The caller closes both (``engine.close()``, ``rec.close()``)."""
    override = parse_entry(entry)
    from ..engine import Engine
    from ..store import open_recording

    rec = open_recording(run)
    try:
        return rec, Engine(rec, device=device, entry=override, trust=trust)
    except BaseException:
        rec.close()
        raise

"""Opening a recording and starting the replay engine on it (torch is imported here)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import RecordingError, UsageError
from ..store.liveness import WriterState, wait_for_drain

__all__ = ["open_engine", "parse_entry", "wait_until_drained"]

DRAIN_WAIT = 600.0  # seconds; REPLAY_DRAIN_WAIT overrides


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def wait_until_drained(run: str, notify: Callable[[str], None] = _say) -> None:
    """A recording whose training died is still being committed by its writer process: wait
    for it rather than replay a partial window (a live run is read as it is)."""

    def waiting(state: WriterState) -> None:
        more = f" ({state.steps_to_come} steps to come)" if state.steps_to_come else ""
        notify(f"replay: {run}: its training died; waiting for its writer to finish{more}")

    try:
        timeout = float(os.environ.get("REPLAY_DRAIN_WAIT", DRAIN_WAIT))
    except ValueError:
        timeout = DRAIN_WAIT
    if not wait_for_drain(run, timeout=timeout, on_wait=waiting):
        raise RecordingError(
            f"{run}: its writer process is still committing the steps of a training run that "
            f"died, after {timeout:g} s; run this again once it has finished (replay info shows it)"
        )


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
    run: str,
    device: str | None = None,
    entry: str | None = None,
    trust: bool = False,
    check: Callable[[Any], None] | None = None,
) -> tuple[Any, Any]:
    """``(recording, engine)``: the recording opened, the entry points imported, the objects
    built. The caller closes both (``engine.close()``, ``rec.close()``). ``check(recording)``
    runs before any user code is imported (to refuse a request the file alone shows wrong)."""
    override = parse_entry(entry)
    from ..engine import Engine
    from ..store import open_recording

    wait_until_drained(run)
    rec = open_recording(run)
    try:
        if check is not None:
            check(rec)
        return rec, Engine(rec, device=device, entry=override, trust=trust)
    except BaseException:
        rec.close()
        raise

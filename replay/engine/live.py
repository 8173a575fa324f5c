"""Replaying a recording that is still being written: the window committed when it was opened.

The writer keeps going while replay reads: its rings overwrite the oldest steps and snapshots,
so the window computed at open could vanish under the replay (``bisect`` failed with ``internal
error: KeyError: 'step 300 is not in the snapshots ring'``, ``verify`` with "the recording may
be damaged"; issue 32, item 5). At open the window's records are read into memory, newest first
(the oldest go first in the rings), up to a budget; the window then starts at the oldest snapshot
whose steps were all read. Nothing of the live file is read for the window afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import RecordingError
from ..limits import env_number
from ..store.liveness import writer_state
from ..store.reader import Recording, Window
from ..store.tree import TensorLeaf, leaves

__all__ = ["LiveCopy", "pin_live_window"]

BUDGET = 2 << 30  # bytes of records held in memory; REPLAY_LIVE_BUDGET overrides


@dataclass
class LiveCopy:
    """The records of a live recording's window, read when it was opened."""

    window: Window
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    snapshots: dict[int, dict[str, Any]] = field(default_factory=dict)


def _nbytes(tree: Any) -> int:
    return sum(x.nbytes for _, x in leaves(tree) if isinstance(x, TensorLeaf))


def pin_live_window(
    rec: Recording, window: Window | None, log: Callable[[str], None], tries: int = 20
) -> LiveCopy | None:
    """``None`` when no process writes ``rec`` (its file holds still); else the window's
    records, read now, and the window they cover. The writer can overwrite a slot while its
    checksum is read (a window that looks empty for a moment): a few tries."""
    state = writer_state(rec.file)
    if state is None or state.draining:
        return None
    for i in range(tries):
        if i:
            time.sleep(0.05)
            window = rec.replayable_window()
        copy = _read(rec, window) if window is not None else None
        if copy is not None:
            log(
                f"replay: {rec.path} is still being written (training process {state.pid}); "
                f"replaying steps {copy.window.first}..{copy.window.last}, what was committed "
                "when it was opened"
            )
            return copy
    raise RecordingError(
        f"{rec.path} is still being written (training process {state.pid}) faster than its "
        "newest steps could be read; run this again once it has finished, or record with a "
        "larger reach"
    )


def _read(rec: Recording, window: Window) -> LiveCopy | None:
    """The window's records, newest first (the oldest go first in the rings), up to the budget;
    ``None`` when not even the newest snapshot's steps could be read."""
    copy = LiveCopy(window)
    used, budget = 0, env_number("REPLAY_LIVE_BUDGET", BUDGET)
    first: int | None = None  # the oldest snapshot whose steps through window.last are read
    for t in range(window.last, window.first - 1, -1):
        try:
            copy.steps[t] = rec.read_step(t)
            used += _nbytes(copy.steps[t])
            if t in window.snapshots:
                copy.snapshots[t] = rec.read_snapshot(t)
                used += _nbytes(copy.snapshots[t])
                first = t
        except (KeyError, RecordingError):
            break  # overwritten meanwhile by the writer: what is older is gone too
        if used > budget and first is not None:
            break
    if first is None:
        return None
    copy.steps = {t: v for t, v in copy.steps.items() if t >= first}
    copy.snapshots = {s: v for s, v in copy.snapshots.items() if s >= first}
    copy.window = Window(first, window.last, tuple(s for s in window.snapshots if s >= first))
    return copy

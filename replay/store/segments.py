"""Resumed runs never destroy a recording: a Recorder opening a path where one exists keeps it.

A run resumed from a checkpoint (a crash, a preemption, HF ``resume_from_checkpoint``,
Lightning ``fit(ckpt_path=...)``) used to replace the crashed run's recording: the evidence was
gone. Now the new run records into the next free *segment* file beside it: ``run.h5`` ->
``run.1.h5``, ``run.2.h5``, ... (``run.rank0.h5`` -> ``run.1.rank0.h5`` under DDP), and says
so in one line on stderr. ``replay info run.h5`` names the other segments.

A file another live recorder is writing is left to the writer's lock (the second Recorder
refuses and trains on, ``store/writer.py``), never sidestepped into a segment; a file whose
writer is still draining the steps of a training process that died is kept like any other.
"""

from __future__ import annotations

import glob
import os
import re
import stat
import sys
from collections.abc import Callable

from .liveness import writer_state

__all__ = ["segment_path", "segment_files", "later_segments", "MAX_SEGMENTS"]

MAX_SEGMENTS = 10_000


def _recording_there(path: str) -> bool:
    """A regular file is there (a link, a FIFO or a device is the writer's to refuse)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def segment_path(path: str, rank_path: Callable[[str], str] | None = None) -> str:
    """The file a new Recorder of ``path`` writes: ``path`` itself when no recording is there
    (or a live writer holds it), else the next free segment. ``rank_path``: ``fn(base) -> the
    rank's file`` under DDP (each rank checks its own file; ranks whose earlier files all exist
    agree). A new segment is announced in one line on stderr."""
    own: Callable[[str], str] = rank_path if rank_path is not None else (lambda p: p)
    first = own(path)
    if not _recording_there(first):
        return first
    live = writer_state(first)
    if live is not None and not live.draining:
        return first  # another run is recording there: its writer's lock refuses this one
    # (a draining writer's training is dead: a run restarted at once gets its own segment)
    root, ext = os.path.splitext(path)
    for n in range(1, MAX_SEGMENTS):
        candidate = own(f"{root}.{n}{ext}")
        if not os.path.lexists(candidate):
            print(
                f"replay: {first} holds an earlier recording, kept; this run records to "
                f"{candidate}",
                file=sys.stderr,
                flush=True,
            )
            return candidate
    return first  # (ten thousand segments: the writer's own rules apply)


def segment_files(path: str) -> list[str]:
    """The other segment files of the recording ``path`` (``run.h5`` -> ``run.1.h5``, ...;
    from ``run.2.h5`` the others too), in segment order, existing ones only."""
    return [f for _, f in _segments(path) if f != os.path.abspath(path)]


def later_segments(path: str) -> list[str]:
    """The segments recorded after ``path`` (a run resumed from it, and so on), in order."""
    found = _segments(path)
    mine = next((n for n, f in found if f == os.path.abspath(path)), None)
    return [] if mine is None else [f for n, f in found if n > mine]


def _segments(path: str) -> list[tuple[int, str]]:
    """Every existing segment of the recording ``path``, ``path`` itself included, with its
    number (0 for the first), in segment order; absolute paths."""
    path = os.path.abspath(path)
    root, ext = os.path.splitext(path)
    m = re.fullmatch(r"(.*)\.(\d+)", root)
    base_root = m.group(1) if m and os.path.exists(m.group(1) + ext) else root
    found: list[tuple[int, str]] = []
    if base_root != root or os.path.exists(base_root + ext):
        found.append((0, base_root + ext))
    for f in glob.glob(glob.escape(base_root) + ".*" + glob.escape(ext)):
        n = re.fullmatch(re.escape(base_root) + r"\.(\d+)" + re.escape(ext), f)
        if n:
            found.append((int(n.group(1)), f))
    return sorted(found)

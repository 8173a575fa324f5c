"""Which way a command replays a DDP rank set: every rank together, or one rank alone.

A rank set (``run.h5`` naming ``run.rank0.h5``, ``run.rank1.h5``, ...) is replayed with every
rank together by default (``replay.multirank.launch``): the collectives happen for real
and the replay is the recording on every rank. ``--rank N --alone`` replays one rank in this
process (``alone.py``): exact at the first step after a snapshot only (it updates with that rank's
own gradients, not the all-reduced average), so its report says ``"approximate": true``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import RecordingError, UsageError
from ..ranks.files import is_rank_recording
from ..ranks.scan import RankScan, rank_set
from ..store import open_recording

__all__ = ["RankChoice", "choose_ranks", "APPROXIMATE"]

APPROXIMATE = (
    "one DDP rank replayed alone: exact at the first step after a snapshot; later steps update "
    "with this rank's own gradients instead of the all-reduced average (replay without --alone "
    "replays every rank together)"
)


@dataclass(frozen=True)
class RankChoice:
    """``scan``: the rank set (``None``: a plain recording). ``together``: replay every rank at
    once. ``path``: the one file to replay in this process otherwise."""

    scan: RankScan | None
    together: bool
    path: str
    lone_rank: bool = False  # ``path`` is one rank's file named on its own

    @property
    def approximate(self) -> bool:
        """One rank of a DDP run replayed in this process, without its peers."""
        return not self.together and (self.scan is not None or self.lone_rank)


def _recorded_under_ddp(path: str) -> bool:
    try:
        with open_recording(path, health_only=True) as rec:
            return is_rank_recording(rec.meta)
    except (RecordingError, OSError):
        return False  # the replay itself says what is wrong with the file


def choose_ranks(run: str, rank: int | None, alone: bool) -> RankChoice:
    """Decide from ``RUN``, ``--rank`` and ``--alone``; misuse is a :class:`UsageError`.

    ``--rank N --alone`` replays rank N's file even when a peer's file is missing or damaged
    (the user chose the rank); every other way needs the whole set."""
    if rank is not None and not alone:
        raise UsageError(
            "--rank N replays one rank alone, which is approximate: pass --rank N --alone "
            "(without both, every rank is replayed together)"
        )
    scan = rank_set(run, strict=rank is None)
    if scan is None:
        if rank is not None or alone:
            raise UsageError(f"--rank/--alone: {run} is not a DDP rank set (NAME.rank<N>.h5)")
        return RankChoice(
            None, False, run, lone_rank=os.path.isfile(run) and _recorded_under_ddp(run)
        )
    if not alone:
        return RankChoice(scan, True, run)
    if rank is None:
        return RankChoice(scan, False, run)  # the culprit rank, as bisect picks it
    files = scan.paths
    if rank not in files:
        raise UsageError(f"--rank {rank}: {run} holds ranks {', '.join(map(str, sorted(files)))}")
    return RankChoice(scan, False, files[rank])

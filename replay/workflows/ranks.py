"""Which way a command replays a DDP rank set: every rank together, or one rank alone.

A rank set (``run.h5`` naming ``run.rank0.h5``, ``run.rank1.h5``, ...) is replayed with every
rank together by default (``replay.multirank.launch``): the collectives happen for real
and the replay is the recording on every rank. ``--rank N --alone`` replays one rank in this
process, as before: exact at the first step after a snapshot only (it updates with that rank's
own gradients, not the all-reduced average), so its report says ``"approximate": true``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import UsageError

__all__ = ["RankChoice", "choose_ranks", "APPROXIMATE"]

APPROXIMATE = (
    "one DDP rank replayed alone: exact at the first step after a snapshot; later steps update "
    "with this rank's own gradients instead of the all-reduced average (replay without --alone "
    "replays every rank together)"
)


@dataclass(frozen=True)
class RankChoice:
    """``files``: the rank set's files by rank (``None``: a plain recording). ``together``:
    replay every rank at once. ``path``: the one file to replay in this process otherwise."""

    files: dict[int, str] | None
    together: bool
    path: str
    lone_rank: bool = False  # ``path`` is one rank's file named on its own

    @property
    def approximate(self) -> bool:
        """One rank of a DDP run replayed in this process, without its peers."""
        return not self.together and (self.files is not None or self.lone_rank)


def _is_rank_file(path: str) -> bool:
    from ..errors import RecordingError
    from ..store import open_recording

    try:
        with open_recording(path) as rec:
            d = rec.meta.get("distributed") or {}
    except (RecordingError, OSError):
        return False  # the replay itself says what is wrong with the file
    return int(d.get("world_size") or 1) > 1


def choose_ranks(run: str, rank: int | None, alone: bool) -> RankChoice:
    """Decide from ``RUN``, ``--rank`` and ``--alone``; misuse is a :class:`UsageError`."""
    from ..distributed.ranks import open_rank_set, resolve_rank_files

    if rank is not None and not alone:
        raise UsageError(
            "--rank N replays one rank alone, which is approximate: pass --rank N --alone "
            "(without both, every rank is replayed together)"
        )
    found = resolve_rank_files(run)
    if found is None:
        if rank is not None or alone:
            raise UsageError(f"--rank/--alone: {run} is not a DDP rank set (NAME.rank<N>.h5)")
        return RankChoice(None, False, run, lone_rank=os.path.isfile(run) and _is_rank_file(run))
    with open_rank_set(found) as rs:
        files = rs.paths
    if not alone:
        return RankChoice(files, True, run)
    if rank is None:
        return RankChoice(files, False, run)  # the culprit rank, as bisect picks it
    if rank not in files:
        raise UsageError(f"--rank {rank}: {run} holds ranks {', '.join(map(str, sorted(files)))}")
    return RankChoice(files, False, files[rank])

"""Reading DDP rank sets: one recording per rank, read back as a set.

``ranks`` (file sets, the first bad (step, rank), per-rank health) is numpy + h5py only, like the
store, so ``replay info`` and the TUI use it without torch; ``bisect`` adapts a rank's bisect.
The recorder's torch side is ``replay/record/ddp``; replaying every rank together is
``replay/multirank``.
"""

from .ranks import (
    RankFailure,
    RankSet,
    base_path,
    describe_failure,
    first_bad_rank,
    open_rank_set,
    rank_health,
    rank_path,
    resolve_rank_files,
)

__all__ = [
    "RankFailure",
    "RankSet",
    "base_path",
    "describe_failure",
    "first_bad_rank",
    "open_rank_set",
    "rank_health",
    "rank_path",
    "resolve_rank_files",
]

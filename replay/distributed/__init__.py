"""Recording and bisecting DDP runs: one recording per rank, read back as a rank set.

``ranks`` (file sets, the first bad (step, rank), per-rank health) is numpy + h5py only, like the
store, so ``replay info`` and the TUI use it without torch. ``context``, ``hook`` and
``consistency`` are the recorder's torch side: import them explicitly.
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

"""Reading DDP rank sets: one recording per rank, read back as a set.

``ranks`` (file names, the first bad (step, rank), per-rank health) and ``scan`` (the one
resolver every command asks: each rank file read once, in parallel, a missing or damaged one
refused) are numpy + h5py only, like the store, so ``replay info`` and the TUI use them without
torch; ``bisect`` adapts a rank's bisect.
The recorder's torch side is ``replay/record/ddp``; replaying every rank together is
``replay/multirank``.
"""

from .ranks import (
    RankEvidence,
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
from .scan import RankScan, rank_set, scan_rank_set

__all__ = [
    "RankEvidence",
    "RankFailure",
    "RankScan",
    "RankSet",
    "base_path",
    "describe_failure",
    "first_bad_rank",
    "open_rank_set",
    "rank_health",
    "rank_path",
    "rank_set",
    "resolve_rank_files",
    "scan_rank_set",
]

"""What the Ranks view reads: every rank of a DDP run, side by side (numpy + h5py, never torch).

A rank set is named as ``replay info`` names it (``replay/ranks/scan.py``): the base path
``run.h5`` beside ``run.rank0.h5``, ``run.rank1.h5``..., a directory or a glob. The TUI opens the
culprit rank's file like any recording and keeps this summary of all ranks next to it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from replay.errors import RecordingError
from replay.ranks.files import open_rank_set
from replay.ranks.first_bad import describe_failure
from replay.ranks.scan import rank_set
from replay.safetext import term_safe

__all__ = ["RankRow", "RankSetSummary", "read_rank_set", "trace_line"]


@dataclass(frozen=True)
class RankRow:
    """One rank: its file, what it recorded and where its *own* values first went bad."""

    rank: int
    name: str
    steps: np.ndarray  # health steps, int64
    loss: np.ndarray  # float64, NaN/Inf kept (the sparkline marks them)
    steps_total: int
    own_bad: tuple[int, tuple[str, ...]] | None  # (step, reasons: loss / local_grad / exception)
    trace: str | None = None  # what this rank's forensics sidecar says (replay bisect, all ranks)

    @property
    def last_loss(self) -> float | None:
        return float(self.loss[-1]) if len(self.loss) else None


@dataclass(frozen=True)
class RankSetSummary:
    spec: str
    world_size: int | None
    missing: tuple[int, ...]
    rows: tuple[RankRow, ...]
    culprit_ranks: tuple[int, ...]  # empty when no rank failed
    culprit_step: int | None
    reason: str  # describe_failure(): the same sentence `replay info` prints
    opened_rank: int  # the rank whose recording the other views show

    def signature(self) -> tuple[tuple[int, int], ...]:
        """Changes when any rank recorded more (the live-refresh check)."""
        return tuple((r.rank, r.steps_total) for r in self.rows)


def trace_line(path: str, run_id: str) -> str | None:
    """One line from a rank's forensics sidecar: the step traced and the op its verdict names.

    ``replay bisect`` on a rank set traces the culprit step on every rank, each into its own
    sidecar; a rank whose NaN/Inf only came through the all-reduce names no op of its own.
    ``None`` when there is no sidecar, or it belongs to another run or cannot be read.
    """
    if not os.path.exists(path):
        return None
    from replay.store.forensics import ForensicsReader, NotAForensicsFile

    try:
        with ForensicsReader.open(path) as f:
            if f.run_id != run_id:
                return None
            v, step = f.verdict, f.step
    except (NotAForensicsFile, OSError):
        return None
    kind = v.get("kind")
    if v.get("op"):
        what = f"{v['op']} ({v.get('phase')})"
        if v.get("module") is not None:
            what += f" in {v['module'] or '<model>'}"
        if kind == "exception":
            exc = v.get("exception") or {}
            what = f"raised {exc.get('type', 'an exception')} at {what}"
    elif kind == "nonfinite":
        what = "no op of its own made it: NaN/Inf arrived through the all-reduce"
    else:
        what = "nothing non-finite, no exception"
    return term_safe(f"step {step}: {what}")


def read_rank_set(spec: str, opened_rank: int) -> RankSetSummary:
    """Summarise the rank set ``spec`` (raises ``RecordingError`` when it is unreadable, and
    ``IncompleteRankSetError`` when a rank's file is missing or damaged)."""
    scan = rank_set(spec)
    if scan is None:
        raise RecordingError(f"{spec}: not a DDP rank set (NAME.rank<N>.h5 files)")
    with open_rank_set(list(scan.paths.values()), name=spec) as rs:
        rows = []
        for r, rec in rs.recordings.items():
            h = rec.health()
            ev = scan.ranks[r].evidence
            own = None if ev is None or ev.own_step is None else (ev.own_step, ev.own)
            rows.append(
                RankRow(
                    rank=r,
                    name=term_safe(os.path.basename(rec.path)),
                    steps=np.asarray(h["step"], dtype=np.int64),
                    loss=np.asarray(h["loss"], dtype=np.float64),
                    steps_total=int(rec.status().get("steps_total", len(h["step"]))),
                    own_bad=own,
                    trace=trace_line(rec.forensics_path, rec.run_id),
                )
            )
    failure = scan.first_bad
    return RankSetSummary(
        spec=spec,
        world_size=scan.world_size,
        missing=scan.missing,
        rows=tuple(rows),
        culprit_ranks=failure.ranks if failure is not None else (),
        culprit_step=failure.step if failure is not None else None,
        reason=describe_failure(failure),
        opened_rank=opened_rank,
    )

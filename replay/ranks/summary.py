"""One summary of a scanned rank set (numpy + h5py, no torch): what ``replay info``, the TUI's
Ranks view and ``replay report``'s page each show of it, read once by :func:`summarise`.

Every readable rank's row (steps, loss, replayable window, where its own values first went bad,
its median step time, what its forensics sidecar says), the missing and damaged ranks, the first
bad (step, rank) in the words every view uses, and the slowest rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..reports.info import RecordingSteps
from ..reports.ranks import RankFailure
from ..reports.verdict import Ended, TraceVerdict
from ..safetext import term_safe
from ..store.forensics import ForensicsReader, NotAForensicsFile
from ..store.reader import Recording
from .files import open_rank_set
from .first_bad import describe_failure
from .scan import RankScan

__all__ = ["RankRow", "RankSetSummary", "summarise", "trace_line"]


@dataclass(frozen=True)
class RankRow:
    """One readable rank: its file, what it recorded and where its *own* values first went bad."""

    rank: int
    path: str
    steps: np.ndarray  # health steps, int64
    loss: np.ndarray  # float64, NaN/Inf kept (the TUI's sparkline marks them)
    steps_total: int
    window: tuple[int, int] | None  # the replayable window
    closed: bool
    own_bad: tuple[int, tuple[str, ...]] | None  # (step, what: loss / local_grad / exception)
    median_step_s: float | None
    trace: str | None = None  # what this rank's forensics sidecar says (replay bisect, all ranks)
    detail: RecordingSteps | None = None  # `replay info`'s own lines of the file
    ended: Ended | None = None  # its program raised outside any step (the file's /ended)

    @property
    def health_steps(self) -> tuple[int, int] | None:
        return (int(self.steps[0]), int(self.steps[-1])) if len(self.steps) else None

    @property
    def last_loss(self) -> float | None:
        """The last finite loss."""
        finite = self.loss[np.isfinite(self.loss)]
        return float(finite[-1]) if finite.size else None

    def to_json(self) -> dict[str, Any]:
        own = None if self.own_bad is None else [self.own_bad[0], list(self.own_bad[1])]
        detail = self.detail.to_json() if self.detail is not None else {}
        return {"path": self.path, **detail, "own_first_bad": own}


@dataclass(frozen=True)
class RankSetSummary:
    """A rank set: every readable rank's row, the ranks without a file, the damaged ones (rank
    -> one line) and the first bad (step, rank) over the readable ranks."""

    spec: str
    world_size: int | None
    rows: tuple[RankRow, ...]
    missing: tuple[int, ...] = ()
    damaged: dict[int, str] = field(default_factory=dict)
    first_bad: RankFailure | None = None

    @property
    def complete(self) -> bool:
        return not self.missing and not self.damaged

    @property
    def culprit_ranks(self) -> tuple[int, ...]:
        return self.first_bad.ranks if self.first_bad is not None else ()

    @property
    def culprit_step(self) -> int | None:
        return self.first_bad.step if self.first_bad is not None else None

    @property
    def summary(self) -> str:
        """The first bad (step, rank) in one line (:func:`describe_failure`)."""
        return describe_failure(self.first_bad)

    @property
    def slowest(self) -> tuple[RankRow, float] | None:
        """The rank whose median step took longest, and the others' median (two ranks or more
        with step times)."""
        timed = [r for r in self.rows if r.median_step_s is not None]
        if len(timed) < 2:
            return None
        slow = max(timed, key=lambda r: r.median_step_s or 0.0)
        return slow, float(np.median([r.median_step_s for r in timed if r is not slow]))

    def signature(self) -> tuple[tuple[int, int], ...]:
        """Changes when any rank recorded more (the TUI's live-refresh check)."""
        return tuple((r.rank, r.steps_total) for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        """``replay info --json`` of the set."""
        return {
            "rank_set": self.spec,
            "world_size": self.world_size,
            "complete": self.complete,
            "missing_ranks": list(self.missing),
            "damaged_ranks": {str(r): why for r, why in self.damaged.items()},
            "ranks": {r.rank: r.to_json() for r in self.rows},
            "first_bad": None if self.first_bad is None else self.first_bad.to_json(evidence=True),
            "summary": self.summary,
        }


def summarise(
    scan: RankScan, detail: Callable[[Recording], RecordingSteps] | None = None
) -> RankSetSummary:
    """Read every readable rank of ``scan`` once; ``detail`` adds a caller's own lines of each
    file to its row (``replay info``'s)."""
    rows = []
    with open_rank_set(scan) as rs:
        for r, rec in rs.recordings.items():
            h, w, status = rec.health(), rec.replayable_window(), rec.status()
            ev = scan.ranks[r].evidence
            times = h["wall_time"][np.isfinite(h["wall_time"])]
            rows.append(
                RankRow(
                    rank=r,
                    path=rec.path,
                    steps=np.asarray(h["step"], dtype=np.int64),
                    loss=np.asarray(h["loss"], dtype=np.float64),
                    steps_total=int(status.get("steps_total") or len(h["step"])),
                    window=(w.first, w.last) if w else None,
                    closed=bool(status.get("closed")),
                    own_bad=None if ev is None or ev.own_step is None else (ev.own_step, ev.own),
                    median_step_s=float(np.median(times)) if times.size else None,
                    trace=trace_line(rec.forensics_path, rec.run_id),
                    detail=detail(rec) if detail is not None else None,
                    ended=rec.ended(),
                )
            )
    damaged = {r: f.damaged or "" for r, f in scan.damaged.items()}
    return RankSetSummary(
        scan.spec, scan.world_size, tuple(rows), scan.missing, damaged, scan.first_bad
    )


def trace_line(path: str, run_id: str) -> str | None:
    """One line from a rank's forensics sidecar: the step traced and the op its verdict names.

    ``replay bisect`` on a rank set traces the culprit step on every rank, each into its own
    sidecar; a rank whose NaN/Inf only came through the all-reduce names no op of its own.
    ``None`` when there is no sidecar, or it belongs to another run or cannot be read.
    """
    if not os.path.exists(path):
        return None
    try:
        with ForensicsReader.open(path) as f:
            if f.run_id != run_id:
                return None
            v, step = TraceVerdict.from_json(f.verdict), f.step
    except (NotAForensicsFile, OSError):
        return None
    if v.op:
        what = f"{v.op} ({v.phase})"
        if v.module is not None:
            what += f" in {v.module or '<model>'}"
        if v.kind == "exception":
            exc = v.exception or {}
            what = f"raised {exc.get('type', 'an exception')} at {what}"
    elif v.kind == "nonfinite":
        what = "no op of its own made it: NaN/Inf arrived through the all-reduce"
    else:
        what = "nothing non-finite, no exception"
    return term_safe(f"step {step}: {what}")

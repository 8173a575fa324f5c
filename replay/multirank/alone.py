"""Bisecting one rank of a DDP run in a single process, without a process group.

The rank's own forward and backward produced its loss and its pre-all-reduce gradients, so a
plain-model replay (``build_fn``, no DDP wrapper) reproduces them at the first step after a
snapshot, bit for bit: ``loss`` against the recorded loss, the replayed ``grad_norm`` against the
recorded ``local_grad_norm``. What the recording measured *after* the all-reduce (``grad_norm``,
``param_fingerprint``) holds every rank's average and is not comparable, and steps after the
snapshot are replayed with this rank's own gradient instead of the average, so their loss may
drift from the recording. :class:`RankSubject` shows the bisector the rank-local view, and
:func:`adjust_verdict` says so in the verdict instead of blaming hardware.
"""

from __future__ import annotations

import math
from typing import Any

from ..bisect.compare import same_bits
from ..bisect.search import NoteKind, note_kind
from ..engine import Engine
from ..engine.subject import EngineSubject
from ..reports import BisectReport

__all__ = ["RankSubject", "adjust_verdict"]

_NOT_COMPARABLE = ("param_fingerprint",)


class RankSubject(EngineSubject):
    """The engine's subject, its recorded and replayed rows in this rank's local terms."""

    def __init__(self, engine: Engine, rank: int) -> None:
        super().__init__(engine)
        self.rank = rank
        self.replayed: dict[int, dict[str, Any]] = {}
        self.again: dict[int, dict[str, Any]] = {}

    def recorded_rows(self) -> list[dict[str, Any]]:
        rows = [self._local(r) for r in super().recorded_rows()]
        for r in rows:
            if not math.isnan(r.get("local_grad_nonfinite", math.nan)):
                r["grad_norm"] = r["local_grad_norm"]
                r["grad_nonfinite"] = r["local_grad_nonfinite"]
        return rows

    def _local(self, row: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``row`` without the columns that hold every rank's average."""
        return {**row, **{c: None for c in _NOT_COMPARABLE}}

    def replay(self, step: int, *, keep: bool = True, fresh: bool = False) -> dict[str, Any]:
        self.replayed[step] = row = self._local(super().replay(step, keep=keep, fresh=fresh))
        return row

    def replay_again(self, step: int) -> dict[str, Any]:
        self.again[step] = row = self._local(super().replay_again(step))
        return row


def adjust_verdict(v: BisectReport, subject: RankSubject) -> None:
    """Reword a verdict for a rank replayed alone (see the module docstring)."""
    v.notes.append(
        f"DDP rank {subject.rank} replayed alone: its loss and own gradient norm are exact at the "
        "snapshot step; later steps update with this rank's gradient, not the all-reduced average"
    )
    d = v.divergence
    if d is None or v.snapshot is None or d.step == v.snapshot:
        return
    # Drift after the snapshot step is the missing all-reduce, not non-determinism.
    v.notes = [n for n in v.notes if note_kind(n) is not NoteKind.NONDETERMINISM]
    t = v.first_bad_step
    first, again = (None, None) if t is None else (subject.replayed.get(t), subject.again.get(t))
    if first is not None and again is not None:
        cols = ("loss", "grad_norm", "loss_nonfinite", "grad_nonfinite", "param_nonfinite")
        v.reproducible = all(same_bits(first.get(c), again.get(c)) for c in cols)

"""What counts as a failure: non-finite values, an exception, or a user predicate.

Each criterion answers two questions over health rows (dicts of health columns plus ``step``):
where the recording first shows the symptom (``first_symptom``), and, while replaying, whether a
replayed row fails (``watcher``). Rows come from the recording or from a replay alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..store.layout import HEALTH_COLUMNS
from .predicate import Expression, History, object_columns_in

__all__ = [
    "Criterion",
    "Symptom",
    "NonFinite",
    "Raised",
    "Predicate",
    "auto_criterion",
    "criterion_named",
    "is_nonfinite",
]

Row = dict[str, Any]
Watcher = Callable[[Row], bool]  # whether a replayed row fails


def _flag(row: Row, col: str) -> bool:
    return row.get(col) == 1.0  # (neither None nor NaN is)


def is_nonfinite(row: Row) -> bool:
    """NaN/Inf in the loss, in gradients before the update or in parameters after it, of the
    run's model or of any other watched object (``netG__grad_nonfinite``, capture/watch.py).

    AMP-aware: infinite gradients in a step the GradScaler skipped are the scaler doing its job.
    """
    skipped = _flag(row, "scaler_skipped")
    grads = _flag(row, "grad_nonfinite") and not skipped
    if _flag(row, "loss_nonfinite") or _flag(row, "param_nonfinite") or grads:
        return True
    objects = (col for col in row if col.endswith(_OBJECT_FLAGS) and _flag(row, col))
    return any(col.endswith("__param_nonfinite") or not skipped for col in objects)


_OBJECT_FLAGS = ("__grad_nonfinite", "__param_nonfinite")


@dataclass(frozen=True)
class Symptom:
    """``bound``: the first recorded step that shows the failure at all (the search ends there);
    ``step``: the step where the symptom a user sees was recorded (e.g. the first NaN loss)."""

    bound: int
    step: int


class Criterion(Protocol):
    kind: str
    checks_snapshots: bool  # a snapshot holding NaN/Inf is already past the failure

    def describe(self) -> str: ...
    def first_symptom(self, rows: Sequence[Row]) -> Symptom | None: ...
    def watcher(self, prior: Sequence[Row]) -> Watcher: ...


class NonFinite:
    kind = "nonfinite"
    checks_snapshots = True

    def describe(self) -> str:
        return "NaN/Inf in the loss, the gradients or the parameters"

    def first_symptom(self, rows: Sequence[Row]) -> Symptom | None:
        bound = next((int(r["step"]) for r in rows if is_nonfinite(r)), None)
        if bound is None:
            return None
        # What the user saw: the first NaN loss (NonFiniteLossError); else the first flag.
        loss = next(
            (int(r["step"]) for r in rows if r["step"] >= bound and _flag(r, "loss_nonfinite")),
            bound,
        )
        return Symptom(bound, loss)

    def watcher(self, prior: Sequence[Row]) -> Watcher:
        return is_nonfinite


class Raised:
    kind = "exception"
    checks_snapshots = False

    def describe(self) -> str:
        return "the step raised an exception"

    def first_symptom(self, rows: Sequence[Row]) -> Symptom | None:
        step = next((int(r["step"]) for r in rows if _flag(r, "raised")), None)
        return None if step is None else Symptom(step, step)

    def watcher(self, prior: Sequence[Row]) -> Watcher:
        return lambda row: _flag(row, "raised")


class Predicate:
    """A user expression (``--until``, ``--spike``) over health columns and earlier aggregates."""

    kind = "predicate"
    checks_snapshots = False

    def __init__(self, expr: Expression) -> None:
        self.expr = expr

    def describe(self) -> str:
        return self.expr.text

    def _history(self) -> History:
        return History({a.column for a in self.expr.aggregates})

    def first_symptom(self, rows: Sequence[Row]) -> Symptom | None:
        hist = self._history()
        for r in rows:
            if self.expr.evaluate(r, hist):
                return Symptom(int(r["step"]), int(r["step"]))
            hist.add(r)
        return None

    def watcher(self, prior: Sequence[Row]) -> Watcher:
        hist = self._history()
        for r in prior:
            hist.add(r)

        def fails(row: Row) -> bool:
            hit = self.expr.evaluate(row, hist)
            hist.add(row)
            return hit

        return fails


def criterion_named(kind: str = "auto", until: str | None = None) -> Criterion | None:
    """The criterion ``--kind`` names (``None`` for ``auto``: :func:`auto_criterion` decides
    from the recorded health), or the predicate ``until`` over the health columns and the object
    columns it names (a :class:`PredicateError` when it does not parse)."""
    if until is not None:
        return Predicate(Expression.parse(until, (*HEALTH_COLUMNS, *object_columns_in(until))))
    if kind == "nonfinite":
        return NonFinite()
    return Raised() if kind == "exception" else None


def auto_criterion(rows: Sequence[Row]) -> Criterion:
    """With no kind asked for: whichever failure the recording shows first (NaN/Inf on a tie)."""
    nf, ex = NonFinite().first_symptom(rows), Raised().first_symptom(rows)
    if ex is not None and (nf is None or ex.bound < nf.bound):
        return Raised()
    return NonFinite()

"""What one replayed step produced, in the recorder's own health-column terms."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..capture.health import object_values
from ..store.layout import object_columns

__all__ = ["StepOutcome"]


def _f(x: float | None) -> float:
    return math.nan if x is None else float(x)


@dataclass
class StepOutcome:
    """One replayed step; ``None`` means "not measured", as a NaN cell in the recorded health.

    The numbers are computed with the recorder's own functions, so they compare bitwise.
    """

    step: int
    loss: float | None = None
    grad_norm: float | None = None
    param_fingerprint: float | None = None
    grad_absmax: float | None = None  # decide the non-finite flags exactly, as the recorder does
    param_absmax: float | None = None
    optimizer_stepped: float | None = None
    scale: float | None = None
    scale_after: float | None = None
    lr: float | None = None
    exception: dict[str, str] | None = None
    # The watched objects' measurements (capture/watch.py), ``<object>__grad_norm`` and so on,
    # and their names: their columns are computed as the recorder computes them.
    watched: tuple[str, ...] = ()
    objects: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """A health row (the columns a replay reproduces) plus ``step`` and ``exception``.

        Mirrors ``capture.health.health_row``: a raised step measures nothing but ``raised``.
        """
        row: dict[str, Any] = {"step": self.step, "exception": self.exception}
        row["raised"] = float(self.exception is not None)
        row["lr"] = _f(self.lr)
        row["scale"] = _f(self.scale)
        if self.exception is not None:
            not_measured = (
                "loss",
                "grad_norm",
                "param_fingerprint",
                "loss_nonfinite",
                "grad_nonfinite",
                "param_nonfinite",
                "optimizer_stepped",
                "scaler_skipped",
                *object_columns(self.watched),
            )
            return row | dict.fromkeys(not_measured, math.nan)
        row["loss"] = _f(self.loss)
        row["grad_norm"] = _f(self.grad_norm)
        row["param_fingerprint"] = _f(self.param_fingerprint)
        row["optimizer_stepped"] = _f(self.optimizer_stepped)
        row["loss_nonfinite"] = (
            math.nan if self.loss is None else float(not math.isfinite(row["loss"]))
        )
        gflag = self.grad_absmax if self.grad_absmax is not None else self.grad_norm
        pflag = self.param_absmax if self.param_absmax is not None else self.param_fingerprint
        row["grad_nonfinite"] = math.nan if gflag is None else float(not math.isfinite(gflag))
        row["param_nonfinite"] = math.nan if pflag is None else float(not math.isfinite(pflag))
        # As recorded: with a scaler, "skipped" is scale-after < scale-before (NaN compares False).
        row["scaler_skipped"] = (
            math.nan if self.scale_after is None else float(self.scale_after < _f(self.scale))
        )
        for name in self.watched:
            row.update(zip(object_columns((name,)), object_values(self.objects, name)))
        return row

"""Tracing the culprit step the bisector found: per-op verdict, culprit samples, forensics file.

Uses ``replay.trace`` (the per-op tracer) through the engine's two calls: ``state_before(t)``
and ``run_step(t, batch=...)``. Returns the JSON fields the bisect report fills.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .engine import Engine

__all__ = ["trace_culprit", "tracer_available"]


def tracer_available() -> bool:
    try:
        import replay.trace  # noqa: F401
    except ImportError:
        return False
    return True


def _step_fails(kind: str, row: dict[str, Any]) -> bool:
    if kind == "exception":
        return row.get("raised") == 1.0
    from ..bisect.criteria import is_nonfinite

    return is_nonfinite(row)


def _data_samples(batch, size: int) -> list[int]:
    """The samples (dim 0) that hold the batch's non-finite values."""
    from replay.trace.picture import batch_leaves

    found: set[int] = set()
    for _, t in batch_leaves(batch):
        if t.is_floating_point() and t.dim() >= 1 and t.shape[0] == size:
            found |= set(torch.nonzero(~torch.isfinite(t.detach()))[:, 0].tolist())
    return sorted(found)


def trace_culprit(
    engine: Engine, step: int, kind: str, *, forensics_path: str, run_id: str
) -> dict[str, Any]:
    """Trace ``step`` from the state right before it; write the sidecar; return report fields."""
    from replay.trace import (
        batch_size_of,
        find_culprit_samples,
        has_batch_coupling,
        slice_batch,
        trace_step,
    )

    engine.state_before(step, keep=True)
    batch = engine.batch(step)
    try:
        result = trace_step(
            engine.model, engine.optimizer, engine.step_fn, batch, scaler=engine.scaler
        )
    finally:
        engine.invalidate()  # the tracer ran the step on the live objects
    v = result.verdict
    size = batch_size_of(batch)
    if v.get("cause") == "data" and size:
        # the batch holds the NaN/Inf: its samples are read off it, no replay needed
        samples = _data_samples(batch, size)
        if samples:
            result.set_samples(samples, True)
    if kind in ("nonfinite", "exception") and size and size > 1 and not v.get("samples"):

        def fails(indices: list[int]) -> bool:
            engine.state_before(step, keep=True)
            sub = slice_batch(engine.batch(step), indices)
            out = engine.run_step(step, batch=sub)
            return _step_fails(kind, out.row())

        samples, exact = find_culprit_samples(fails, size, coupled=has_batch_coupling(engine.model))
        rest = [i for i in range(size) if i not in set(samples)]
        # Only an answer when those samples matter: if the rest of the batch fails as well
        # (a NaN injected in the gradient, a bad learning rate) no sample is to blame.
        if len(samples) < size and not (rest and fails(rest)):
            result.set_samples(samples, exact)
    result.write(forensics_path, run_id=run_id, step=step)
    fields = {
        "cause": v.get("cause"),
        "op_index": v.get("op_index"),
        "op": v.get("op"),
        "phase": v.get("phase"),
        "module": v.get("module"),
        "source": v.get("source"),
        "made": v.get("made"),
        "made_from": v.get("made_from"),
        "nan_from_inf": v.get("nan_from_inf"),
        "data": v.get("data"),
        "samples": v.get("samples"),
        "samples_exact": v.get("samples_exact"),
        "trace_notes": list(v.get("notes") or []),
        "forensics": forensics_path,
    }
    loss = result.loss
    if loss is not None and isinstance(loss, float) and not math.isfinite(loss):
        fields["traced_loss"] = "nan" if math.isnan(loss) else ("inf" if loss > 0 else "-inf")
    return fields

"""Tracing the culprit step the bisector found: per-op verdict, culprit samples, forensics file.

Uses ``replay.trace`` (the per-op tracer) through the engine's two calls: ``state_before(t)``
and ``run_step(t, batch=...)``. Returns what the trace named (``replay.reports.TracedOp``), the
fields the bisect and trace reports fill.

Samples are positions along the batch's sample axis, which need not be dim 0
(``replay.trace.samples.choose_sample_axes``: time-major ``[T, B]`` batches, micro-batches
``[M, B, ...]``, whose samples are ``[micro-batch, row]`` pairs). When the batch itself holds
the NaN/Inf (verdict cause ``"data"``) the samples are read off the batch; otherwise they are
found by delta debugging with replays. When no sample can be blamed, a note says why. A step
function may name its axis: ``train_step.batch_axis = 1`` (or ``(0, 1)`` for micro-batches).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..bisect.compare import same_bits
from ..bisect.criteria import is_nonfinite
from ..capture.objects import gather_state
from ..engine import Engine
from ..jsonsafe import json_safe
from ..reports import BisectReport, TracedOp, TraceVerdict
from ..store.tree import leaf_path, leaves
from ..trace import trace_step
from ..trace.dispatch import compiled_frames
from ..trace.picture import batch_leaves
from ..trace.result import TraceResult
from ..trace.samples import (
    Failure,
    FailureProbe,
    batch_size_of,
    candidate_axes,
    choose_sample_axes,
    find_culprit_samples,
    has_batch_coupling,
    micro_list,
    no_dropout,
    sample_layout,
    sample_list,
    slice_batch,
    zipped,
)
from ..trace.stats import floating
from ..trace.step import CompiledDuringTrace, stderr_progress

if TYPE_CHECKING:
    from ..store.reader import Recording

__all__ = ["trace_culprit", "sample_axes", "no_culprit_note"]


def no_culprit_note(what: str, picked: list[int], size: int, dim: int) -> str:
    """Why no ``what`` (sample, micro-batch) is named: ``picked`` fail alone, and so does the
    rest of the ``size`` along ``dim``; or ``picked`` is the whole batch: no part of it failed
    alone (the search keeps a part only when it fails)."""
    if len(picked) == size:
        return (
            f"no {what} is to blame: no part of the batch along dim {dim} fails on its own, only "
            "the whole batch (statistics over the batch, or random draws that change with its "
            "size, make the failure)"
        )
    whats = "micro-batches" if what == "micro-batch" else f"{what}s"
    who = (
        f"{what} {picked[0]} fails"
        if len(picked) == 1
        else f"{whats} {', '.join(map(str, picked))} fail"
    )
    return f"no {what} is to blame: {who} alone, and so does the rest of the batch without them"


def _probe(engine: Engine, step: int) -> Callable[[Any], tuple[float | None, int]]:
    """``probe(batch) -> (loss, forward calls)``: step ``step`` replayed on ``batch`` from the
    state before it, without dropout (``choose_sample_axes``)."""

    def probe(batch: Any) -> tuple[float | None, int]:
        calls = []
        engine.state_before(step, keep=True)
        h = engine.model.register_forward_pre_hook(lambda *_: calls.append(1))
        try:
            with no_dropout():
                out = engine.run_step(step, batch=batch)
        finally:
            h.remove()
        return (None if out.exception is not None else out.loss), len(calls)

    return probe


def _data_samples(batch: Any, axes: list[int]) -> list[Any]:
    """Positions along ``axes`` of the batch's non-finite values (pairs for two axes)."""
    if axes == [0, 1] and micro_list(batch):  # (micro-batch, row): each one's rows
        return [[j, r] for j, item in enumerate(batch) for r in _data_samples(item, [0])]
    if axes == [0] and (sample_list(batch) or zipped(batch)):  # samples that hold a NaN/Inf
        return [
            i
            for i in range(batch_size_of(batch) or 0)
            if any(
                floating(t) and not bool(torch.isfinite(t.detach()).all())
                for _, t in batch_leaves(slice_batch(batch, [i]))
            )
        ]
    sizes = [batch_size_of(batch, a) for a in axes]
    found: set[tuple[int, ...]] = set()
    for _, t in batch_leaves(batch):
        if not floating(t) or t.dim() <= max(axes):
            continue
        if any(t.shape[a] != n for a, n in zip(axes, sizes)):
            continue
        pos = torch.nonzero(~torch.isfinite(t.detach()))
        found |= {tuple(p) for p in pos[:, axes].tolist()}
    return [p[0] if len(axes) == 1 else list(p) for p in sorted(found)]


def trace_verdict(
    engine: Engine,
    rec: Recording,
    verdict: BisectReport,
    *,
    reraise: tuple[type[BaseException], ...] = (),
) -> TracedOp | None:
    """Trace a bisect verdict's step per op (when it has one and it replayed) into the
    forensics sidecar and return what it named. A tracer that fails leaves a note instead: the
    step verdict stands without it (``reraise``: what must still end the replay, as a
    multi-rank replay's lockstep failure)."""
    t = verdict.first_bad_step
    if t is None or verdict.reproducible is None:
        return None
    trace = functools.partial(trace_culprit, engine, rec, kind=verdict.kind)
    try:
        traced = trace(t, reproducible=verdict.reproducible)
        # The step began with non-finite state (cause "state"): the step that made it so is
        # earlier, and it is the one to report and trace, not this one with a note.
        first = t
        while traced.cause == "state":
            went = _state_went_bad(engine, t)
            if went is None:
                start = engine.window.snapshot_for(t)
                traced.trace_notes.append(
                    f"the state was already non-finite when step {start} began, the first "
                    f"replayable step before step {t}: the step that made it so is no longer "
                    "kept; record with a larger reach (Recorder(reach=...))"
                )
                break
            t = went
            traced = trace(t, samples=False)
        if t != first:
            verdict.notes.append(
                f"step {first} began with non-finite state (parameters, gradients, buffers or "
                f"optimizer state) that no health column showed: step {t} made it so, and is "
                "the step reported and traced"
            )
            verdict.first_bad_step = t
            engine.state_before(t)
            verdict.take_row(engine.run_step(t).row())
        return traced
    except reraise:
        raise
    except Exception as e:  # noqa: BLE001 - the step verdict stands without the trace
        verdict.notes.append(f"tracing step {t} failed: {type(e).__name__}: {e}")
        return None


def _nonfinite_state(engine: Engine) -> set[str]:
    """The paths of the live objects' non-finite tensors (parameters, buffers, gradients,
    optimizer state, the other named objects')."""
    with torch.no_grad():
        return {
            leaf_path(k)
            for k, t in leaves(gather_state(engine.objs))
            if isinstance(t, torch.Tensor) and floating(t) and not bool(torch.isfinite(t).all())
        }


def _state_went_bad(engine: Engine, t: int) -> int | None:
    """The step before ``t`` after which a tensor of the live state first held NaN/Inf (one
    that was finite at the start of the replayable stretch: a ``-inf`` mask buffer stays one).
    ``None`` when no replayed step before ``t`` did (the state was already bad at its start)."""
    start = engine.window.snapshot_for(t)
    engine.state_before(start)
    baseline = _nonfinite_state(engine)
    for s in range(start, t):
        engine.state_before(s + 1)
        if _nonfinite_state(engine) - baseline:
            return s
    return None


def trace_culprit(
    engine: Engine,
    rec: Recording,
    step: int,
    kind: str,
    *,
    samples: bool = True,
    reproducible: bool | None = None,
) -> TracedOp:
    """Trace ``step`` from the state right before it into ``rec``'s sidecar; return what it named.

    ``samples=False``: no culprit samples are searched (a step whose failure shows only in
    state no health column measures: replaying it on part of the batch tells nothing).
    ``reproducible``: bisect's finding at ``step``, kept in the sidecar's verdict."""

    def traced(direct: bool) -> TraceResult:
        engine.state_before(step, keep=True)
        try:
            return trace_step(
                engine.model,
                engine.optimizer,
                engine.step_callable(step),
                engine.batch(step),
                scaler=engine.scaler,
                progress=stderr_progress(),
                others={
                    k: v for k, v in engine.objs.named.items() if k not in ("model", "optimizer")
                },
                direct_dispatch=direct,
            )
        finally:
            engine.invalidate()  # the tracer ran the step on the live objects

    try:
        result = traced(direct=True)
    except CompiledDuringTrace:  # compiled on its first call: again, seeing compiled ops
        result = traced(direct=False)
    batch = engine.batch(step)
    found = TraceVerdict.from_json(result.verdict)
    disagree = compiled_disagreement(engine, step, kind, found, result.loss)
    if disagree is not None:
        result.add_notes([disagree])
        if found.kind != kind:
            result.verdict["cause"] = "compiled"
    if not samples:
        result.add_notes(
            [
                f"no samples are searched at step {step}: what went bad there (the state) shows "
                "in no health column a replay on part of the batch could be judged by"
            ]
        )
    elif found.cause == "state" or result.verdict["cause"] == "compiled":
        pass  # state: bisect goes back to the step that made it bad, and searches there;
        # compiled: the search's replays on part of the batch run the step eagerly too
    elif kind in ("nonfinite", "exception") and not found.samples:
        try:
            _samples(engine, step, kind, batch, result)
        except Exception as e:  # noqa: BLE001 - the op verdict stands without the samples
            result.add_notes([f"the samples search failed: {type(e).__name__}: {e}"])
    _where_they_came_from(engine, step, result)
    result.verdict["reproducible"] = reproducible  # bisect's finding, kept for the page
    result.write(rec.forensics_path, run_id=rec.run_id, step=step)
    loss = result.loss
    nonfinite_loss = loss is not None and isinstance(loss, float) and not math.isfinite(loss)
    return TracedOp.from_verdict(
        TraceVerdict.from_json(result.verdict),
        rec.forensics_name or rec.forensics_path,
        traced_loss=json_safe(loss) if nonfinite_loss else None,
    )


def compiled_disagreement(
    engine: Engine, step: int, kind: str, found: TraceVerdict, traced_loss: object
) -> str | None:
    """What a step that ran torch.compile'd code and its per-op trace, which runs the step
    eagerly (``trace.step._eager``), say differently: the compiled replay (as recorded) fails
    and the eager one does not, or their losses differ bitwise; ``None`` when they agree or
    nothing compiled ran. Was: a trace that named no op, and a samples search that found none,
    for a NaN only the compiled code made."""
    row = next((r for r in engine.recorded_rows() if r["step"] == step), None)
    if not compiled_frames() or row is None:
        return None
    eager = "raised" if found.exception else f"loss {json_safe(traced_loss)}"
    if kind in ("nonfinite", "exception") and found.kind != kind:
        failed = "raises" if kind == "exception" else f"loss {json_safe(row.get('loss'))}"
        return (
            f"compiled and eager replays disagree: step {step} fails compiled, as recorded "
            f"({failed}), and not when run eagerly, as the per-op trace runs a torch.compile'd "
            f"model ({eager}): the compiled code computes otherwise than the eager ops (fused "
            "float16/bfloat16 intermediates kept in float32, another order of summing), so no "
            "eager op made the failure; torch._inductor.config.emulate_precision_casts = True, "
            'or torch.compile(backend="aot_eager"), tells whether the kernels or the graph differ'
        )
    recorded = row.get("loss")
    if isinstance(traced_loss, float) and not same_bits(recorded, traced_loss):
        return (
            f"compiled and eager replays disagree at step {step}: loss {json_safe(recorded)} "
            f"compiled (as recorded), {json_safe(traced_loss)} run eagerly by the per-op trace; "
            "the trace's values are the eager code's"
        )
    return None


def _where_they_came_from(engine: Engine, step: int, result: TraceResult) -> None:
    """Name each culprit sample where the user can find it: a batch drawn from a dataset by
    reference (``Recorder(loader=...)``) gives each row's index in the dataset, and a dataset
    that lists its files (an ``ImageFolder``'s ``samples``) the file. Was: "samples 21", the
    row in the batch, for a NaN planted at dataset index 3000."""
    v = result.verdict
    samples, axes = v.get("samples"), v.get("sample_axes") or [0]
    if not samples or list(axes) != [0]:
        return
    idx = engine.batch_indices(step)
    if idx is None or not all(isinstance(s, int) and 0 <= s < len(idx) for s in samples):
        return
    dataset = getattr(engine.loader, "dataset", None)
    v["sample_sources"] = [{"index": idx[s], "file": _file_of(dataset, idx[s])} for s in samples]


def _file_of(dataset: Any, i: int, depth: int = 0) -> str | None:
    """The file a dataset says its sample ``i`` comes from: ``samples``/``imgs`` as
    torchvision's ``ImageFolder`` and ``DatasetFolder`` keep them (``(path, class)`` pairs),
    or ``files``; through a ``Subset``'s indices. ``None`` when it does not say."""
    if depth < 4 and hasattr(dataset, "indices") and hasattr(dataset, "dataset"):
        try:
            return _file_of(dataset.dataset, int(dataset.indices[i]), depth + 1)
        except (IndexError, TypeError, ValueError):
            return None
    for name in ("samples", "imgs", "files"):
        listed = getattr(dataset, name, None)
        if not isinstance(listed, (list, tuple)) or not 0 <= i < len(listed):
            continue
        item = listed[i]
        path = item[0] if isinstance(item, (list, tuple)) and item else item
        if isinstance(path, (str, os.PathLike)):
            return os.fspath(path)
    return None


def sample_axes(engine: Engine, step: int, batch: Any) -> tuple[list[int], list[str]]:
    """The axes of step ``step``'s ``batch`` that index samples, and notes on how they were
    found: the step function's ``batch_axis`` when it fits, else ``choose_sample_axes`` (which
    may replay the step, or the one before it, to tell candidate axes apart). The diagnosis and
    ``replay whatif --drop-samples`` slice along the same axes."""
    # The probe replays the step before the failure when it is replayable and its batch has the
    # same layout (its loss is finite), else the failing one.
    pstep, pbatch = step, batch
    if step - 1 in engine.window:
        prev = engine.batch(step - 1)
        if candidate_axes(prev) == candidate_axes(batch):
            pstep, pbatch = step - 1, prev
    hint = getattr(engine.step_fn, "batch_axis", None)
    return choose_sample_axes(pbatch, _probe(engine, pstep), hint)


def _samples(engine: Engine, step: int, kind: str, batch: Any, result: TraceResult) -> None:
    axes, notes = sample_axes(engine, step, batch)
    result.add_notes(notes)
    if not axes:
        return
    if TraceVerdict.from_json(result.verdict).cause == "data":
        samples = _data_samples(batch, axes)
        if samples:
            result.set_samples(samples, True, axes)
    else:
        _search(engine, step, kind, batch, axes, has_batch_coupling(engine.model), result)
    if result.verdict.get("samples"):
        result.verdict["sample_layout"] = sample_layout(batch, axes)


def _search(
    engine: Engine,
    step: int,
    kind: str,
    batch: Any,
    axes: list[int],
    coupled: Any,
    result: TraceResult,
) -> None:
    """Delta debugging along the sample axis (for micro-batches: the micro-batches first, then
    the rows within those). Sets the samples, or leaves a note why there are none."""

    def failure_of(sub: Any) -> Failure | None:
        engine.state_before(step, keep=True)
        probe = FailureProbe(nonfinite=kind != "exception")
        with probe:
            out = engine.run_step(step, batch=sub)
        # (a step that raised is an exception failure, whatever its row says)
        return probe.failure(out.exception, is_nonfinite(out.row()))

    outer = axes[0]
    size = batch_size_of(batch, outer)
    if not size or size < 2:
        result.add_notes(
            [f"the batch holds one sample along dim {outer}: there is no sample to single out"]
        )
        return
    reference = failure_of(batch)
    if reference is None or (kind in ("exception", "nonfinite") and reference.kind != kind):
        result.add_notes(
            ["the step did not fail the same way again under the samples search: no sample named"]
        )
        return
    others: dict[Failure, None] = {}  # different failures sub-batches ran into, in order

    def fails_on(sub: Any) -> bool:
        """The sub-batch fails the same way as the whole batch: kind, op, exception type."""
        f = failure_of(sub)
        if f is not None and f != reference:
            others[f] = None
        return f == reference

    picked, exact = find_culprit_samples(
        lambda ix: fails_on(slice_batch(batch, ix, outer)), size, coupled=coupled
    )
    rest = [i for i in range(size) if i not in set(picked)]
    # Only an answer when those samples matter: if the rest of the batch fails as well
    # (a NaN injected in the gradient, a bad learning rate) no sample is to blame.
    if len(picked) == size or (rest and fails_on(slice_batch(batch, rest, outer))):
        # Sub-batches broke in another way than the batch: the cut left its tensors
        # inconsistent (a leaf cut that should not be, or one left whole).
        if others:
            seen = ", ".join(f.describe() for f in list(others)[:3])
            result.add_notes(
                [
                    f"the batch's tensors could not be cut consistently along dim {outer}: "
                    f"sub-batches failed differently ({seen}) than the whole batch "
                    f"({reference.describe()}): no sample named"
                ]
            )
            return
        what = "micro-batch" if len(axes) > 1 else "sample"
        result.add_notes([no_culprit_note(what, picked, size, outer)])
        return
    if len(axes) == 1:
        result.set_samples(picked, exact, axes)
        return
    inner = axes[1]
    sub = slice_batch(batch, picked, outer)
    rows = batch_size_of(sub, inner) or 0
    if rows < 2:
        result.set_samples([[m, 0] for m in picked], exact, axes)
        return
    found, exact2 = find_culprit_samples(
        lambda ix: fails_on(slice_batch(sub, ix, inner)), rows, coupled=coupled
    )
    if len(found) == rows:
        result.add_notes(
            [
                f"micro-batch(es) {', '.join(map(str, picked))} fail, but no row within them "
                "is to blame on its own"
            ]
        )
        result.set_samples([[m, r] for m in picked for r in range(rows)], False, axes)
        return
    pairs = [[m, r] for m in picked for r in found]
    result.set_samples(pairs, exact and exact2 and len(picked) == 1, axes)

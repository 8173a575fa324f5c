"""``trace_step``: run the user's own step once under the tracer and judge it."""

from __future__ import annotations

import math
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from replay.store.forensics import MODULE_COLUMNS, PHASES
from replay.trace.mode import Tracer, TracerFault
from replay.trace.origins import storages
from replay.trace.picture import (
    BatchPicture,
    ParamPicture,
    batch_leaves,
    batch_nonfinite,
    batch_picture,
    mask_buffer_keys,
    present_keys,
)
from replay.trace.result import TraceException, TraceResult
from replay.trace.samples import batch_size_of
from replay.trace.scope import Activation
from replay.trace.source import Interner, snapshot_sources
from replay.trace.spool import CHUNK_ROWS, OpColumns
from replay.trace.stats import floating
from replay.trace.verdict import build_verdict

__all__ = ["trace_step", "StepFn", "stderr_progress", "CompiledDuringTrace", "TraceFailed"]


class CompiledDuringTrace(RuntimeError):
    """``trace_step(direct_dispatch=True)`` ran a step that compiled code (``torch.compile``
    on its first call): the unwrapped dispatch mode does not see compiled ops, so the result
    would miss them. Restore the state before the step and trace it again without."""


class TraceFailed(RuntimeError):
    """The tracer's own work failed at an op (a bug in replay): the trace names no op rather
    than one the failure made up; bisect keeps the step's verdict with this as a note."""


#: ``step_fn(model, optimizer, batch)``: the user's training step; what it returns (the loss,
#: a tensor or a float, or anything else) is looked at, not required.
StepFn = Callable[[torch.nn.Module, torch.optim.Optimizer | None, Any], object]
_NO_ACTIVATION = Activation(np.nan, np.nan, np.nan, np.nan, np.nan)  # a module that never ran


def _eager(model: torch.nn.Module, step_fn: StepFn) -> tuple[torch.nn.Module, StepFn]:
    """A ``torch.compile``\\ d model is traced eagerly: its ``_orig_mod``, with dynamo off."""
    eager: torch.nn.Module = getattr(model, "_orig_mod", model)
    if eager is not model or any(hasattr(m, "_orig_mod") for m in eager.modules()):
        with warnings.catch_warnings():  # torch.jit deprecation noise on importing dynamo
            warnings.simplefilter("ignore", DeprecationWarning)
            import torch._dynamo

        return eager, torch._dynamo.disable(step_fn)  # type: ignore[no-untyped-call]  # torch stubs
    return eager, step_fn


PROGRESS_EVERY_S = 2.0  # seconds: a step traced faster than this prints nothing


def stderr_progress() -> Callable[[Tracer], None]:
    """What a long trace says on stderr every few seconds: ops traced, the closure call, the
    step's phase (``replay trace: 240,000 ops · closure call 12 · backward · 31 s``)."""
    start = time.monotonic()
    last = [start]

    def report(tr: Tracer) -> None:
        now = time.monotonic()
        if now - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = now
        phases = tr.log.cols.buf["phase"]
        phase = str(PHASES[phases[-1]]) if phases else "?"
        call = f" · closure call {tr.phase.closure + 1}" if tr.phase.closure >= 0 else ""
        sys.stderr.write(
            f"replay trace: {len(tr.log.cols):,} ops{call} · {phase} · {now - start:.0f} s\n"
        )
        sys.stderr.flush()

    return report


def _state_tensors(
    modules: list[tuple[str, torch.nn.Module]], opts: list[tuple[str, Any]]
) -> dict[str, torch.Tensor]:
    """The floating buffers of ``modules`` and the floating state of ``opts`` (moments, momentum
    buffers), by name: what a step changes besides parameters and gradients."""
    out: dict[str, torch.Tensor] = {}
    for prefix, m in modules:
        out |= {f"{prefix}{n}": b for n, b in m.named_buffers() if floating(b)}
    for prefix, opt in opts:
        index = {id(p): i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
        for p, st in opt.state.items():
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and floating(v) and v.numel():
                    out[f"{prefix}state[{index.get(id(p), '?')}].{k}"] = v
    return out


def _finite(t: torch.Tensor) -> bool:
    with torch.no_grad():
        return bool(torch.isfinite(t).all())


def _match_raise(tracer: Tracer, exc: BaseException) -> int | None:
    text = str(exc)
    for r in reversed(tracer.findings.raised):
        if r.exc is exc or (str(r.exc) and (str(r.exc) in text or text in str(r.exc))):
            return r.index
    return None


def trace_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step_fn: StepFn,
    batch: Any,
    *,
    scaler: object = None,
    progress: Callable[[Tracer], None] | None = None,
    others: Mapping[str, object] | None = None,
    direct_dispatch: bool = False,
) -> TraceResult:
    """Run ``step_fn(model, optimizer, batch)`` once, recording every aten op of forward,
    backward and the optimizer step, and return what was seen with a verdict.

    The step's exception, if any, is caught and described in the result (never re-raised).
    ``scaler``: the GradScaler the step uses, so that a step it skips is not a failure.
    ``progress``: called every few thousand ops (``stderr_progress()`` prints a line on stderr
    every few seconds).
    ``others``: the run's other models and optimizers by name (a GAN's ``netG``, ``optG``):
    their gradients and parameters are sinks too, their modules are named ``netG.<module>``,
    and their state is present before the step like the model's.
    ``direct_dispatch``: skip dynamo's wrapper around the dispatch mode where nothing compiled
    seems to run (about 9 us an op); raises ``CompiledDuringTrace`` when the step compiled
    anyway, after which the caller restores the state and traces again without it.

    Example::

        r = trace_step(model, opt, train_step, (x, y))
        print(r.verdict["kind"], r.verdict["op"], r.verdict["module"], r.verdict["source"])
    """
    eager, run = _eager(model, step_fn)
    batch_pic, batch_bad = batch_picture(batch, batch_size_of(batch))
    data = batch_nonfinite(batch) if batch_bad else []
    other = [
        (n, o)
        for n, o in (others or {}).items()
        if isinstance(o, (torch.nn.Module, torch.optim.Optimizer))
    ]
    other_models = [(n, o) for n, o in other if isinstance(o, torch.nn.Module)]
    params = ParamPicture(eager, other_models)
    tracer = Tracer(
        eager,
        optimizer,
        storages(t for _, t in batch_leaves(batch)),
        present_keys(eager, optimizer, [o for _, o in other]),
        cuda=any(p.is_cuda for p in eager.parameters()),
        mask_keys=mask_buffer_keys(eager),
        others=other,
        direct_dispatch=direct_dispatch,
        progress=progress,
    )
    sinks: list[tuple[str, frozenset[int]]] = []
    notes: list[str] = []

    def sink(what: str, bad: list[tuple[str, torch.Tensor]]) -> None:
        """``bad``'s tensors, by name, are non-finite where the step ends up: a sink."""
        if bad:
            origins = frozenset().union(*(tracer.findings.origins.of(t) for _, t in bad))
            sinks.append((f"{what} ({', '.join(n for n, _ in bad[:4])})", origins))

    def grad_sink() -> None:
        params.take_grads()
        sink("gradients", params.bad_grads())

    # Buffers and optimizer state: a sink too when the step makes them non-finite (a running
    # statistic or an Adam moment that overflows while the parameters stay finite), so the step
    # that broke them is the one blamed, not the later step that reads them.
    state_modules = [("", eager)] + [(f"{n}.", o) for n, o in other_models]
    state_opts = [("optimizer.", optimizer)] if optimizer is not None else []
    state_opts += [(f"{n}.", o) for n, o in other if isinstance(o, torch.optim.Optimizer)]
    finite_before = {n: _finite(t) for n, t in _state_tensors(state_modules, state_opts).items()}
    tracer.phase.on_optimizer_pre = grad_sink
    loss_value: float | None = None
    exc_info: Exception | None = None
    try:
        with tracer:
            try:
                loss = run(eager, optimizer, batch)
            except Exception as exc:  # noqa: BLE001 - the step's failure is what we describe
                loss = None
                exc_info = exc
    except TracerFault as fault:
        raise TraceFailed(f"the tracer failed at {fault}") from fault.__cause__
    if tracer.compiled_during:
        raise CompiledDuringTrace("the step compiled code under the unwrapped dispatch mode")
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        loss_value = loss.detach().double().item()
        if not math.isfinite(loss_value):
            sinks.insert(0, ("the loss", tracer.findings.origins.of(loss)))
    elif isinstance(loss, float):
        loss_value = loss
        if not math.isfinite(loss):
            # a Python float carries no storage: any op origin may have made it
            sinks.insert(0, ("the loss", frozenset(tracer.findings.origins.klass)))
    del loss
    if exc_info is None:
        if params.grads is None:  # no optimizer step started (grad_sink takes them there)
            if scaler is not None:
                notes.append(
                    "the GradScaler skipped the optimizer step (non-finite gradients); "
                    "under AMP that is normal, not a failure"
                )
                params.take_grads()
            else:
                grad_sink()
        sink("parameters", params.bad_params())
        state = _state_tensors(state_modules, state_opts).items()
        sink("state", [(n, t) for n, t in state if finite_before.get(n, True) and not _finite(t)])

    exception: TraceException | None = None
    if exc_info is not None:
        loc, _ = tracer.sites.locs.from_traceback(exc_info.__traceback__)
        exception = {
            "type": type(exc_info).__name__,
            "message": str(exc_info),
            "op_index": _match_raise(tracer, exc_info),
            "source": tracer.sites.locs.describe(loc),
            "traceback": "".join(traceback.format_exception(exc_info)),
        }
        exc_info = None
    verdict = build_verdict(
        tracer,
        sinks=sinks,
        exception=exception,
        batch_nonfinite=batch_bad or None,
        data=data,
        notes=notes,
    )
    for r in tracer.findings.raised:
        r.exc = None  # drop its traceback, and the step's frames with it
    result = _result(tracer, eager, params, batch_pic, verdict, exception, loss_value)
    params.release()
    return result


def _result(
    tracer: Tracer,
    model: torch.nn.Module,
    params: ParamPicture,
    batch_pic: BatchPicture,
    verdict: dict[str, Any],
    exception: TraceException | None,
    loss: float | None,
) -> TraceResult:
    ops = OpColumns(tracer.log.cols)
    names = tracer.scope.modules.items
    kinds = Interner()  # module classes
    mods = dict(model.named_modules())
    rows: dict[str, list[float]] = {k: [] for k in MODULE_COLUMNS}
    counts = np.zeros(len(names), dtype=np.int64)
    for a in range(0, ops.rows, CHUNK_ROWS):  # in row ranges: the table may not fit in memory
        m = ops.read("module", a, a + CHUNK_ROWS)
        counts += np.bincount(m[m >= 0], minlength=len(names))[: len(names)]
    index = tracer.scope.modules.index
    for i, name in enumerate(names):
        rows["name"].append(i)
        rows["kind"].append(kinds(type(mods[name]).__name__ if name in mods else "?"))
        rows["parent"].append(index.get(name.rpartition(".")[0], -1) if name else -1)
        for k, v in zip(Activation._fields, tracer.scope.acts.get(i, _NO_ACTIVATION)):
            rows[f"act_{k}"].append(v)
        rows["n_ops"].append(int(counts[i]))
    strings: dict[str, list[str]] = {
        "ops": tracer.log.op_names.items,
        "modules": names,
        "locations": tracer.sites.locs.locations.items,
        "stacks": tracer.sites.locs.stacks.items,
        "shapes": tracer.log.shapes.items,
        "module_kinds": kinds.items,
        "params": list(params.names),
        "nodes": tracer.sites.nodes.items,
    }
    return TraceResult(
        verdict=verdict,
        ops=ops,
        strings=strings,
        modules={k: np.asarray(v) for k, v in rows.items()},
        params=params.table(),
        memory=tracer.log.memory.picture(),
        sources=snapshot_sources(tracer.sites.locs.locations.items),
        batch=batch_pic,
        loss=loss,
        exception=exception,
        notes=verdict["notes"],
    )

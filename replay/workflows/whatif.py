"""What if...: replay the failing stretch of a recording once as recorded and once per change.

``run_whatif(run, [parse_change("scale", "lr=0.1")])`` replays steps ``from_step..to_step``
(default: from the snapshot ``replay bisect`` would start at, or the one before it when that
one is at the failing step itself, through the first bad step + 3, clamped to the window)
from the state right before ``from_step``: first as recorded (the baseline, checked bitwise
against the recording), then once per change, each from that same state. Each experiment says
whether the failure still happens, and where; its loss and gradient norm per step; how far its
end state is from the baseline's.

The changes (each one experiment, the command-line flag in brackets):

=================  ===========================================================================
``set``            ``KEY=VALUE``: a param-group hyper-parameter, in every group, at every step
``scale``          ``KEY=FACTOR``: the recorded value times FACTOR, in every group, every step
``clip``           ``MAXNORM``: clip the gradient norm right before every optimizer step
``skip-step``      ``N``: step N is not run at all; the state carries over to N+1
``drop-samples``   ``N:3,17``: step N runs without those samples, along the diagnosis's axis
``seed``           ``K``: each step's RNG states are restored, then reseeded from K and the step
=================  ===========================================================================

Hyper-parameters are changed after the engine puts the recorded ones back (it does before every
step, since a scheduler stepped outside ``step_fn`` changes them): a change holds at every step,
and ``scale`` scales what the recording had at that step. A change the run cannot take is a
``UsageError`` raised before any experiment runs.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..bisect import auto_criterion, newest_healthy
from ..bisect.compare import compare_rows, with_exception_type
from ..bisect.criteria import is_nonfinite
from ..errors import ReplayError, UsageError
from ..ranks.scan import rank_set
from ..reports.whatif import CHANGES, Experiment, StepResult, WhatIfReport
from ..store import open_recording
from ..store.tree import TensorLeaf, map_tree
from .session import AS_RECORDED, ReplayOptions, together, with_engine

if TYPE_CHECKING:
    from ..engine import Engine
    from ..store.reader import Recording

__all__ = ["Change", "parse_change", "replay_range", "run_whatif", "whatif_work"]

AFTER_FAILURE = 3  # default to_step: the first bad step + this, clamped to the window
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Change:
    """One experiment: ``kind`` (one of ``reports.whatif.CHANGES``) and its argument, parsed."""

    kind: str
    arg: str  # as given, e.g. "lr=0.1"
    key: str | None = None  # set, scale
    value: float | None = None  # set, scale (the factor), clip (max norm)
    step: int | None = None  # skip-step, drop-samples
    samples: tuple[int, ...] = ()  # drop-samples
    seed: int | None = None

    @property
    def text(self) -> str:
        """The change as a command-line flag: ``--scale lr=0.1``, ``--no-autocast``."""
        return f"--{self.kind} {self.arg}" if self.arg else f"--{self.kind}"


_N = TypeVar("_N", int, float)


def _parsed(text: str, what: str, kind: type[_N]) -> _N:
    """``text`` as a ``kind``, or a usage error naming the flag (``what``)."""
    try:
        return kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise UsageError(f"{what}: {text!r} is not {noun}") from None


def parse_change(kind: str, arg: str) -> Change:
    """A change from its flag (``kind`` without the dashes) and argument; checks the syntax
    only (what the recording can take is checked by :func:`run_whatif`).

    >>> parse_change("drop-samples", "37:5").samples
    (5,)
    """
    what = f"--{kind} {arg}"
    if kind in ("set", "scale"):
        key, sep, val = arg.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise UsageError(f"{what}: expected KEY={'VALUE' if kind == 'set' else 'FACTOR'}")
        x = _parsed(val.strip(), what, float)
        if not math.isfinite(x):
            raise UsageError(f"{what}: the value must be finite")
        return Change(kind, arg, key=key, value=x)
    if kind == "clip":
        x = _parsed(arg, what, float)
        if not (x > 0 and math.isfinite(x)):
            raise UsageError(f"{what}: MAXNORM must be a positive number")
        return Change(kind, arg, value=x)
    if kind == "skip-step":
        return Change(kind, arg, step=_parsed(arg, what, int))
    if kind == "drop-samples":
        step, sep, rest = arg.partition(":")
        if not sep or not rest.strip():
            raise UsageError(f"{what}: expected STEP:I,J,... (e.g. 37:3,17)")
        idx = [_parsed(s.strip(), what, int) for s in rest.split(",") if s.strip()]
        if any(i < 0 for i in idx):
            raise UsageError(f"{what}: sample indices must be >= 0")
        return Change(kind, arg, step=_parsed(step, what, int), samples=tuple(sorted(set(idx))))
    if kind == "seed":
        k = _parsed(arg, what, int)
        if k < 0:
            raise UsageError(f"{what}: the seed must be >= 0")
        return Change(kind, arg, seed=k)
    if kind == "no-autocast":
        return Change(kind, "")
    if kind == "dtype":
        if arg != "float32":
            raise UsageError(
                f"{what}: only float32 is supported (the step run without autocast, its "
                "floating batch tensors in float32)"
            )
        return Change(kind, arg)
    raise UsageError(f"unknown change --{kind}; the changes are: " + ", ".join(CHANGES))


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


def _seed_note(e: Experiment, failed_at: int, hi: int) -> str:
    """What another draw of the steps' RNG says (the recorded batches are the same): data or
    luck."""
    if e.first_failure is None:
        return (
            f"{e.change}: with other random draws nothing fails through step {hi}: the draws "
            "the steps make (noise, sampled timesteps, dropout masks) made the failure, not "
            "the data alone"
        )
    if e.first_failure == failed_at:
        return (
            f"{e.change}: other random draws fail at the same step: the data or the state "
            "makes the failure, not the draws"
        )
    return (
        f"{e.change}: other random draws fail too, at step {e.first_failure} instead of "
        f"{failed_at}: not one batch's doing; a draw the steps make (noise, a sampled "
        "timestep, a dropout mask) can reach it"
    )


def _unmeasured_norm(row: dict[str, Any]) -> bool:
    """No optimizer step ran (a micro-step of gradient accumulation), so no norm was taken:
    the row's NaN there is "not measured", not a non-finite gradient."""
    gn = row.get("grad_norm")
    return (
        row.get("optimizer_stepped") == 0.0
        and row.get("grad_nonfinite") != 1.0
        and (gn is None or (isinstance(gn, float) and math.isnan(gn)))
    )


def _result(row: dict[str, Any]) -> StepResult:
    exc = row.get("exception")
    raised = exc is not None or row.get("raised") == 1.0
    return StepResult(
        step=int(row["step"]),
        loss=None if raised else _opt(row.get("loss")),
        grad_norm=None if raised or _unmeasured_norm(row) else _opt(row.get("grad_norm")),
        lr=_opt(row.get("lr")),
        failed=row.get("raised") == 1.0 or is_nonfinite(row),
        exception=(exc or {}).get("type") if isinstance(exc, dict) else None,
    )


def _number_hparam(v: Any) -> bool:
    import torch

    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point()


def _check_hparam(engine: Engine, change: Change, step: int) -> None:
    if engine.optimizer is None:
        raise UsageError(f"{change.text}: the run has no optimizer, so no hyper-parameters")
    groups = engine.record(step).get("hparams") or []
    key = change.key
    assert key is not None  # set and scale are parsed with one
    if not groups or any(key not in g for g in groups):
        known = sorted({k for g in groups for k, v in g.items() if _numeric_leaf(v)})
        raise UsageError(
            f"{change.text}: no hyper-parameter {key!r} in every param group; the recorded "
            f"ones: {', '.join(known) or 'none'}"
        )
    engine.state_before(step)  # the recorded values, as live objects (tensors on the device)
    for g in engine.optimizer.param_groups:
        if not _number_hparam(g.get(key)):
            raise UsageError(
                f"{change.text}: {key} is {type(g.get(key)).__name__}, not a number; only "
                "numeric hyper-parameters can be changed"
            )


def _new_value(old: Any, change: Change) -> Any:
    import torch

    x = change.value
    assert x is not None
    if change.kind == "scale":
        return old * x
    if isinstance(old, torch.Tensor):
        return torch.full_like(old, x)
    if isinstance(old, int) and x.is_integer():
        return int(x)
    return x


def _reseed(k: int, step: int) -> None:
    import numpy as np
    import torch

    s = (k * 1_000_003 + step) % 2**32
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)  # every CUDA device too


@dataclass
class _Plan:
    """A checked change, ready to run."""

    change: Change
    keep: list[int] | None = None  # drop-samples: the sample indices kept
    axis: int = 0


def _numeric_leaf(v: Any) -> bool:
    return isinstance(v, TensorLeaf) or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _check_file(rec: Recording, changes: list[Change]) -> None:
    """What the file alone can refuse, before any user code is imported: a hyper-parameter the
    recording does not have, a step outside the replayable window."""
    w = rec.replayable_window()
    if w is None:
        return  # the engine says why, with its own exit code
    for c in changes:
        if c.step is not None and c.step not in w:
            raise UsageError(w.outside(f"{c.text}: step {c.step}"))
        if c.key is not None:
            groups = rec.read_step(w.last).get("hparams") or []
            if not groups or any(c.key not in g for g in groups):
                known = sorted({k for g in groups for k, v in g.items() if _numeric_leaf(v)})
                raise UsageError(
                    f"{c.text}: the recording has no hyper-parameter {c.key!r} in every param "
                    f"group; it has: {', '.join(known) or 'none'}"
                )


def _check_change(engine: Engine, change: Change, lo: int, hi: int) -> _Plan:
    """The change as the run can take it, or a ``UsageError`` saying why not."""
    if change.kind in ("set", "scale"):
        _check_hparam(engine, change, lo)
    elif change.kind == "clip" and engine.optimizer is None:
        raise UsageError(
            f"{change.text}: the run has no optimizer; the clip runs right before "
            "optimizer.step(), so it needs one"
        )
    elif change.kind == "dtype":
        narrow = sorted(
            {str(p.dtype) for p in engine.model.parameters() if p.is_floating_point()}
            - {"torch.float32"}
        )
        if narrow:
            raise UsageError(
                f"{change.text}: the model's parameters are {', '.join(narrow)}; running the "
                "step in float32 would need them and their optimizer state converted, which "
                "whatif does not do (--no-autocast turns autocast off alone)"
            )
    elif change.kind in ("skip-step", "drop-samples"):
        n = change.step
        assert n is not None
        if not lo <= n <= hi:
            raise UsageError(f"{change.text}: step {n} is outside the steps replayed ({lo}..{hi})")
        if change.kind == "drop-samples":
            return _check_drop(engine, change, n)
    return _Plan(change)


def _check_drop(engine: Engine, change: Change, n: int) -> _Plan:
    from ..trace.samples import batch_size_of
    from .culprit import sample_axes

    batch = engine.batch(n)
    axes, notes = sample_axes(engine, n, batch)
    if not axes:
        raise UsageError(f"{change.text}: step {n}'s batch has no batch axis to drop samples on")
    if len(axes) > 1:
        raise UsageError(
            f"{change.text}: step {n}'s samples are (micro-batch, row) pairs along dims {axes}; "
            "dropping them is not supported yet"
        )
    size = batch_size_of(batch, axes[0]) or 0
    bad = [i for i in change.samples if i >= size]
    if bad:
        raise UsageError(
            f"{change.text}: step {n}'s batch has {size} samples along dim {axes[0]} "
            f"(0..{size - 1}); no sample {', '.join(map(str, bad))}"
        )
    keep = [i for i in range(size) if i not in set(change.samples)]
    if not keep:
        raise UsageError(f"{change.text}: that drops every sample of step {n}'s batch")
    return _Plan(change, keep=keep, axis=axes[0])


@contextmanager
def _autocast_off(on: bool) -> Iterator[None]:
    """Every ``torch.autocast`` region entered meanwhile is entered disabled, however the step
    function named it (``torch.autocast``, ``torch.amp.autocast``, the deprecated
    ``torch.cuda.amp.autocast``: one class, or subclasses of it)."""
    if not on:
        yield
        return
    from torch.amp import autocast_mode

    cls = autocast_mode.autocast
    init = cls.__init__

    def disabled(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["enabled"] = False
        if len(args) >= 3:  # (device_type, dtype, enabled, ...) given by position
            args = (*args[:2], False, *args[3:])
        init(self, *args, **kwargs)

    cls.__init__ = disabled  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__init__ = init  # type: ignore[method-assign]


def _float32(batch: Any) -> Any:
    """The batch with its floating tensors in float32 (the rest as it is)."""
    import torch

    def f(x: Any) -> Any:
        return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    return map_tree(f, batch)


@contextmanager
def _clipping(engine: Engine, max_norm: float | None) -> Iterator[None]:
    """Clip the trained parameters' gradient norm right before every optimizer step (a step
    pre-hook registered after the engine's probe, which measures the norm before it)."""
    if max_norm is None:
        yield
        return
    import torch

    params = engine.objs.trained_params()

    def clip(optimizer: Any, args: Any, kwargs: Any) -> None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)

    assert engine.optimizer is not None  # _check_change refuses a clip without one
    from ..capture.objects import inner_optimizer

    handle = inner_optimizer(engine.optimizer).register_step_pre_hook(clip)
    try:
        yield
    finally:
        handle.remove()


def _run(
    engine: Engine, plan: _Plan | None, lo: int, hi: int, tick: Callable[[], None]
) -> tuple[Experiment, list[dict[str, Any]]]:
    """Replay ``lo..hi`` from the state kept before ``lo``, with ``plan``'s change (or none).
    Returns the experiment and the replayed health rows."""
    from ..trace.samples import slice_batch

    change = plan.change if plan is not None else None
    exp = Experiment("baseline" if change is None else change.text)
    rows: list[dict[str, Any]] = []
    engine.state_before(lo, keep=True)

    def tweak(t: int) -> None:
        if change is None:
            return
        if change.kind in ("set", "scale"):
            key = change.key
            assert key is not None and engine.optimizer is not None  # _check_hparam's
            for g in engine.optimizer.param_groups:
                g[key] = _new_value(g[key], change)
        elif change.kind == "seed":
            assert change.seed is not None
            _reseed(change.seed, t)

    clip = change.value if change is not None and change.kind == "clip" else None
    kind = change.kind if change is not None else None
    wide = kind in ("no-autocast", "dtype")
    with engine.off_record(tweak), _clipping(engine, clip), _autocast_off(wide):
        for t in range(lo, hi + 1):
            tick()
            if change is not None and change.kind == "skip-step" and t == change.step:
                exp.steps.append(StepResult(step=t, skipped=True))
                continue
            batch, samples = None, None
            if plan is not None and plan.keep is not None and t == plan.change.step:
                batch = slice_batch(engine.batch(t), plan.keep, plan.axis)
                samples = len(plan.keep)
            if kind == "dtype":
                batch = _float32(engine.batch(t) if batch is None else batch)
            row = engine.run_step(t, batch=batch).row()
            rows.append(row)
            r = _result(row)
            r.samples = samples
            exp.steps.append(r)
            if r.failed and exp.first_failure is None:
                exp.first_failure = t
            if r.exception is not None:
                exp.stopped = t  # the state is whatever the step left half-done: stop here
                break
    return exp, rows


def _distance(engine: Engine, ref: list[Any]) -> float | None:
    import torch

    with torch.no_grad():
        num = den = 0.0
        for p, q in zip(engine.model.parameters(), ref):
            num += float(torch.sum((p.detach().double() - q.double()) ** 2))
            den += float(torch.sum(q.double() ** 2))
    if not math.isfinite(num) or not math.isfinite(den):
        return math.nan
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def _range(
    engine: Engine,
    rows: list[dict[str, Any]],
    from_step: int | None,
    to_step: int | None,
    notes: list[str],
) -> tuple[int, int, int, str, int | None]:
    """``(snapshot, from, to, kind, first bad step recorded)`` for the replay; a default that
    needs saying goes to ``notes``."""
    w = engine.window
    criterion = auto_criterion(rows)
    symptom = criterion.first_symptom(rows)
    bad = None if symptom is None else symptom.bound
    for flag, s in (("--from-step", from_step), ("--to-step", to_step)):
        if s is not None and s not in w:
            raise UsageError(w.outside(f"{flag} {s}"))
    if from_step is None:
        if bad is not None and bad < w.first:
            raise ReplayError(
                f"the recording first fails at step {bad}, before the replayable window (steps "
                f"{w.first}..{w.last}); pass --from-step to replay part of the window anyway"
            )
        bound = w.last if bad is None else min(bad, w.last)
        candidates = [s for s in w.snapshots if s <= bound]
        start: int | None = candidates[-1]
        if criterion.checks_snapshots:
            start, _ = newest_healthy(candidates, engine.snapshot_finite)
            if start is None:
                raise ReplayError(
                    f"every kept snapshot at or before step {bound} already holds NaN/Inf; "
                    "pass --from-step to replay part of the window anyway"
                )
        if start is not None and start == bad and candidates.index(start) > 0:
            # The snapshot is taken right before the failing step: starting there leaves a
            # change one step to act on, after the state already went bad. Start a snapshot
            # earlier (it is healthy: health only goes bad once).
            start = candidates[candidates.index(start) - 1]
            notes.append(
                f"the snapshot bisect starts from is taken right before the failing step {bad}: "
                f"the replay starts from the one before it, at step {start}"
            )
        from_step = start
    assert from_step is not None
    if to_step is None:
        to_step = w.last if bad is None else max(min(bad + AFTER_FAILURE, w.last), from_step)
    if to_step < from_step:
        raise UsageError(f"--to-step {to_step} is before --from-step {from_step}")
    return w.snapshot_for(from_step), from_step, to_step, criterion.kind, bad


def replay_range(engine: Engine, from_step: int | None, to_step: int | None) -> tuple[int, int]:
    """The steps :func:`run_whatif` replays for ``from_step``/``to_step`` (``None``: its
    defaults) on this engine's recording."""
    _, lo, hi, _, _ = _range(engine, engine.recorded_rows(), from_step, to_step, [])
    return lo, hi


def run_whatif(
    run: str,
    changes: list[Change],
    *,
    from_step: int | None = None,
    to_step: int | None = None,
    options: ReplayOptions = AS_RECORDED,
    progress: Callable[[int, int], None] | None = None,
    opened: Callable[[], None] | None = None,
) -> WhatIfReport:
    """Replay ``run`` as recorded and once per change (see the module docstring).

    Raises ``UsageError`` (exit 2) for a change the run cannot take, before any experiment.
    """
    if not changes:
        raise UsageError("name at least one change (--set, --scale, --clip, --skip-step, ...)")
    scan = rank_set(run)
    if scan is not None:  # a DDP rank set: every rank runs every experiment, together
        if any(c.kind == "drop-samples" for c in changes):
            raise UsageError(
                f"--drop-samples: {run} is a DDP rank set, whose ranks each hold their own batch "
                "(dropping samples on a rank set is not supported)"
            )
        for path in scan.paths.values():  # refused from the files, before any rank runs code
            with open_recording(path) as rec:
                _check_file(rec, changes)
        kinds = [(c.kind, c.arg) for c in changes]
        d = together(scan, "whatif", options, changes=kinds, from_step=from_step, to_step=to_step)
        d["reproduces"] = bool(d["reproduces"]) and bool(d["deterministic"])
        return WhatIfReport.from_json(d)
    return with_engine(
        run,
        whatif_work(run, changes, from_step, to_step, progress, opened),
        options,
        check=lambda r: _check_file(r, changes),
    )


def whatif_work(
    run: str,
    changes: list[Change],
    from_step: int | None,
    to_step: int | None,
    progress: Callable[[int, int], None] | None = None,
    opened: Callable[[], None] | None = None,
) -> Callable[[Recording, Engine], WhatIfReport]:
    """What :func:`run_whatif` does with the engine up (each rank of a multi-rank one runs it)."""

    def work(rec: Recording, engine: Engine) -> WhatIfReport:
        if opened is not None:
            opened()
        rows = engine.recorded_rows()
        notes: list[str] = []
        snap, lo, hi, kind, bad = _range(engine, rows, from_step, to_step, notes)
        # (The checks may replay steps; whatever they leave, the engine knows: a step run on
        # another batch marks the live state as unknown.)
        plans = [_check_change(engine, c, lo, hi) for c in changes]

        done, total = [0], (len(plans) + 1) * (hi - lo + 1)

        def tick() -> None:
            done[0] += 1
            if progress is not None:
                progress(done[0], total)

        by_step = {int(r["step"]): r for r in rows}
        recorded = [_result(by_step[t]) for t in range(lo, hi + 1) if t in by_step]
        for r in recorded:
            if by_step[r.step].get("raised") == 1.0:
                r.exception = (engine.recorded_exception(r.step) or {}).get("type") or "exception"
        rec_fail = next((r.step for r in recorded if r.failed), None)

        base, replayed = _run(engine, None, lo, hi, tick)
        divergence = None
        for row in replayed:
            want = with_exception_type(by_step.get(int(row["step"])), engine.recorded_exception)
            divergence = compare_rows(want, row)
            if divergence is not None:
                break
        params = [p.detach().clone() for p in engine.model.parameters()]
        finite = base.stopped is None and all(bool(p.isfinite().all()) for p in params)
        ref = params if finite else None  # (from a half-done step's or NaN weights: no distance)

        exps = []
        for plan in plans:
            e, _ = _run(engine, plan, lo, hi, tick)
            e.removes_failure = base.first_failure is not None and e.first_failure is None
            if ref is not None and e.stopped is None:
                e.param_distance = _distance(engine, ref)
            exps.append(e)

        if base.first_failure is not None:
            notes += [
                _seed_note(e, base.first_failure, hi)
                for plan, e in zip(plans, exps)
                if plan.change.kind == "seed"
            ]
        if divergence is not None:
            notes.append(
                f"the baseline differs from the recording at step {divergence.step} "
                f"({divergence.column}): the experiments are compared with the baseline; "
                "run `replay verify` to see why"
            )
        if bad is not None and bad > hi:
            notes.append(f"the recording first fails at step {bad}, after the steps replayed")
        if base.first_failure is None:
            notes.append(
                f"the baseline has no failure in steps {lo}..{hi}: there is nothing for a change "
                "to remove"
            )
        return WhatIfReport(
            recording=run,
            window=(engine.window.first, engine.window.last),
            snapshot=snap,
            from_step=lo,
            to_step=hi,
            kind=kind,
            recorded_failure=rec_fail,
            recorded=recorded,
            baseline=base,
            reproduces=divergence is None,
            divergence=divergence,
            experiments=exps,
            notes=notes,
        )

    return work

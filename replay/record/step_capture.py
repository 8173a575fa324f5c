"""A step's work on the training thread, in one object handed a pending step (the Recorder is
its configuration and lifecycle). ``before`` takes what a replay needs from before step ``t``
into a :class:`PendingStep` (a per-step value taken before the step hooks in there), ``take``
hands its record to the transport, ``finish`` (a value after the step: ``_health``) or
``raised`` ends it. Nothing here reads a device value (``inflight.py``), and nothing raises
into training: a failure calls ``give_up`` (recording stops with one warning).
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..capture.bounded import unrecorded, value_excess
from ..capture.fingerprint import absmax, exact_if_needed, loss_of, param_fingerprint
from ..capture.hparams import HyperParams
from ..capture.objects import RunObjects, optimizers, run_params
from ..capture.probe import GradProbe
from ..capture.readback import value_now
from ..capture.rng import capture_rng
from ..capture.tensors import CopyStats, tree_nbytes
from ..capture.watch import ObjectWatch
from ..errors import warn_at_user_line
from ..ranks.policy import RankPolicy, SingleProcess
from ..store.contracts import StepException
from .batch_refs import BatchRefs
from .config import RecorderConfig
from .inflight import InFlight, PendingStep
from .snapshots import Snapshots
from .transport import Transport

__all__ = ["StepCapture"]

_SMALL = frozenset({int, float, bool, type(None)})  # per-step values no limit can refuse


def _looks_bad(loss: Any, gn: torch.Tensor | None) -> bool:
    """A NaN/Inf loss or gradient norm at this step, where reading is free (host memory: a
    device's value is never waited for): then the parameters are checked too, whatever
    ``fingerprint_every`` says (the step that went bad is the one whose flag matters)."""
    for v in (gn, loss):
        if isinstance(v, torch.Tensor):
            v = value_now(v)
        if isinstance(v, float) and not math.isfinite(v):
            return True
    return False


class StepCapture:
    """The per-step side of one recording: the hooks on the objects, the snapshots, the steps
    in flight and the transport they go through."""

    def __init__(
        self,
        config: RecorderConfig,
        objects: RunObjects,
        inner: Any,
        give_up: Callable[[str, Exception], None],
    ) -> None:
        self.config = config
        self.objects = objects
        self.give_up = give_up  # recording fails on the training thread (the recorder warns)
        self.replayable = True  # False: no snapshot is taken (meta.not_replayable)
        self._modules = [m for _, m in inner.named_modules()]
        self.params = [p for p in inner.parameters()]
        # requires_grad of every parameter, into the step record where it changed (gradual
        # unfreezing between steps: a replay from an earlier snapshot freezes them again)
        self._run_params = run_params(objects, inner)
        self._trainable: list[bool] | None = None
        self._opt_params = objects.trained_params()
        self.probe = GradProbe(self._opt_params, objects.optimizer)
        # Every other model and optimizer among the objects (a GAN's netG and optG).
        self.watch = ObjectWatch(objects, inner)
        self.watching = bool(self.watch)  # (fixed at start: read three times a step)
        self._scaler = objects.scaler
        self.snapshots = Snapshots(config, objects, inner)
        self.transport: Transport = None  # type: ignore[assignment]  # (set by the recorder)
        self.ranks: RankPolicy = SingleProcess()
        self.refs: BatchRefs | None = None  # batches by reference (capture/loader.py)
        self._warned_values: set[str] = set()  # per-step values left out (too large): said once
        # steps whose health is on its way to the host (a GPU's: read when its event says so)
        self.inflight = InFlight()
        self.bad: tuple[int, float] | None = None  # a non-finite loss settled, not yet raised
        self.failed = False  # a step raised, or a non-finite loss was found to raise
        self.observed: PendingStep | None = None  # observe_begin's step, until observe_end
        # every optimizer's param-group hyper-parameters, taken before each step
        self.hparams = HyperParams(objects.optimizer, optimizers(objects))
        self._cuda_built = torch.cuda.is_available()  # ~16 us a call inside a training loop

    # -- before the step ----------------------------------------------------------------------

    def before(self, t: int, lr: Any) -> PendingStep:
        """What a replay needs from before step ``t`` runs. ``lr``: the loop's own value, for a
        run without an optimizer."""
        if not self.replayable:
            self.transport.writer_or_start()  # (it creates the file; the log's records wait)
        elif self.snapshots.due(t):
            if self.snapshots.step_hint is None:  # a framework's first step: sized at its end
                self.snapshots.hold(t)
            else:
                self.snapshots.take(t, self.transport)
        copied = CopyStats()
        rng = capture_rng()
        hparams = self.hparams.take(copied)
        lr = hparams[0].get("lr") if hparams else lr
        health: dict[str, Any] = {
            "lr": lr if isinstance(lr, (int, float, torch.Tensor)) else None,
            "raised": 0.0,
        }
        flags = [p.requires_grad for p in self._run_params]
        trainable = None
        if flags != self._trainable:
            if self._trainable is not None:  # unfrozen between steps: a new group, maybe
                self._watch_trained()
            self._trainable, trainable = flags, np.asarray(flags, dtype=bool)
        scaler = self._scaler
        scale = getattr(scaler, "_scale", None) if scaler is not None else None
        if scale is not None:
            health["scale"] = scale.detach().clone()
        modes = [m.training for m in self._modules]
        return PendingStep(t, copied, rng, hparams, modes, health, scale, trainable)

    def _watch_trained(self) -> None:
        """The gradient norm over what the optimizer updates now: a param group the loop added
        (``add_param_group`` when it unfreezes a backbone) is measured too."""
        now = self.objects.trained_params()
        if [id(p) for p in now] != [id(p) for p in self._opt_params]:
            self._opt_params = now
            self.probe.watch(now)

    def begin(
        self,
        t: int,
        batch: Any,
        values: dict[str, Any],
        step_fn: dict[str, Any] | None = None,
        in_effect: dict[str, Any] | None = None,
    ) -> PendingStep | None:
        """Step ``t`` of ``Recorder.step`` is about to run: captured, its probes begun;
        ``None`` when capturing failed (recording stopped: the step runs unrecorded).
        ``step_fn``: the step was handed another step function than the step before's;
        ``in_effect``: the last such change, recorded again where a snapshot is taken."""
        try:
            kept = self.bounded(values) if values else values  # what the record holds
            ref = self.refs.reference(batch) if self.refs is not None else None
            if self.snapshots.step_hint is None:  # the first step's size shapes the file
                self.snapshots.step_hint = (tree_nbytes(batch) if ref is None else 0) + (
                    tree_nbytes(kept)
                )
            if step_fn is None and in_effect is not None and self.snapshots.due(t):
                step_fn = in_effect  # (looked at only once the function changed)
            p = self.before(t, values.get("lr"))
            p.step_fn = step_fn
            self.transport.capture(p, None if ref else batch, kept, ref, self.hparams.others)
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self.give_up("capturing the step", e)
            return None
        self.begin_probes(p)
        return p

    def begin_probes(self, p: PendingStep, at_step: bool = True) -> None:
        p.t0 = time.perf_counter()
        self.probe.begin(at_step=at_step)
        if self.watching:
            self.watch.begin(at_step=at_step)

    def end_probes(self) -> None:
        """The step raised, or was never captured: its probes end unmeasured."""
        self.probe.end(measure=False)
        if self.watching:
            self.watch.end(measure=False)

    def bounded(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` as the step record holds them: one beyond ``capture.bounded.VALUE_LIMITS``
        (nested too deep, too many elements, too many bytes) is replaced by a note of why,
        with one :class:`RecorderWarning` the first time; the step function still gets it."""
        out = values
        for name, v in values.items():
            if type(v) in _SMALL:
                continue
            why = value_excess(v)
            if why is None:
                continue
            if out is values:
                out = dict(values)
            out[name] = unrecorded(f"{type(v).__name__} {why}")
            if name not in self._warned_values:
                self._warned_values.add(name)
                warn_at_user_line(
                    f"replay: the per-step value {name!r} ({type(v).__name__}) is {why}, beyond "
                    "what a step record holds (replay.capture.bounded.VALUE_LIMITS); it is "
                    "recorded as left out, training goes on, and a replay whose step function "
                    "takes it refuses"
                )
        return out

    # -- after the step -----------------------------------------------------------------------

    def finish(self, p: PendingStep, ret: Any) -> list[PendingStep] | None:
        """The step returned ``ret``: its health, launched to the host (``inflight.py``); the
        steps whose health is there, to pass on (``None``: recording failed, and stopped)."""
        try:
            health = p.health
            health["wall_time"] = time.perf_counter() - p.t0
            health["time"] = time.time()
            self._health(p, health, ret)
            self.inflight.launch(p)
            # A step in the step log is in host memory (its copy is done at once): settled now,
            # before the log begins the next one. A GPU step is settled when its copy is done.
            settled = self.inflight.ready()
            if p.direct and self.inflight.queue:
                settled += self.inflight.drain()  # (never waits: see above)
            return settled
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self.give_up("recording the step's health", e)
            return None

    def _health(self, p: PendingStep, health: dict[str, Any], ret: Any) -> None:
        """The health row's values after the step (tensors: read on the host later)."""
        # Before anything else: the norm when no clip or optimizer step measured it (an AMP
        # skip, accumulation, a loop without an optimizer).
        gn, gmax, stepped = self.probe.end()
        p.loss = loss = loss_of(ret)
        health["loss"] = loss
        health["optimizer_stepped"] = float(stepped)
        health["grad_norm"] = gn
        health["grad_absmax"] = gmax  # not a column: decides grad_nonfinite exactly
        params_too = self.config.is_fingerprint_step(p.t) or _looks_bad(loss, gn)
        watch = self.watch
        if self.watching:
            watch.end()
            params_too = params_too or watch.any_bad()
        if params_too:
            fp = param_fingerprint(self.params)
            health["param_fingerprint"] = fp
            health["param_absmax"] = exact_if_needed(fp, lambda: absmax(self.params))
        if self.watching:
            watch.into(health, params_too)
        p.local_gn = self.ranks.local_grad_norm()
        if p.local_gn is not None:
            health["local_grad_norm"] = p.local_gn
        scaler = self._scaler
        if scaler is not None:
            after = getattr(scaler, "_scale", None)
            if p.scale is None and after is not None:
                # GradScaler creates its scale tensor lazily, at the first scale() call: the
                # first step ran with init_scale. Recording NaN here hid a skip of step 0, which
                # then read as a non-finite failure (first_bad) instead of a normal AMP skip.
                health["scale"] = float(getattr(scaler, "_init_scale", math.nan))
            health["scale_after"] = after.detach().clone() if after is not None else None
        if self._cuda_built and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # torch stubs
            health["cuda_allocated"] = float(torch.cuda.memory_allocated())
            health["cuda_peak"] = float(torch.cuda.max_memory_allocated())

    def raised(self, p: PendingStep, e: BaseException) -> None:
        """The step raised ``e``: recorded with its traceback, and every step still in flight
        passed on (the caller flushes, and re-raises)."""
        self.failed = True
        p.health.update(raised=1.0, wall_time=time.perf_counter() - p.t0, time=time.time())
        p.exception = StepException(
            type=type(e).__name__,
            module=type(e).__module__,
            message=str(e),
            traceback="".join(traceback.format_exception(type(e), e, e.__traceback__)),
        )
        try:
            # (its health, and every step's still in flight, waited for: the step is failing)
            self.inflight.launch(p)
            self.pass_on(self.inflight.drain())
        except Exception as rec_error:  # noqa: BLE001 - the user's exception is the one to raise
            self.give_up("recording the exception", rec_error)

    def pass_on(self, settled: list[PendingStep]) -> None:
        """Steps whose health reached the host: to the step log or the writer thread. The first
        non-finite loss among them is kept in ``bad`` (nothing raises here)."""
        try:
            for s in settled:
                if s.exception is None:
                    self.transport.finish(s)
                else:
                    self.transport.raised(s)
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self.give_up("recording the step's health", e)
        if (
            self.bad is None
            and self.config.raise_on_nonfinite
            and not self.ranks.agrees  # (the ranks agree on their stop through their votes)
        ):
            for s in settled:
                if s.exception is None and s.value is not None and not math.isfinite(s.value):
                    self.bad, self.failed = (s.t, s.value), True
                    break

    def drain(self) -> None:
        """Every step still in flight, waited for and passed on (a flush, a close)."""
        self.pass_on(self.inflight.drain())

    def close(self) -> None:
        """The hooks on the objects come off (the transport is the recorder's to close)."""
        if self.refs is not None:
            self.refs.close()
        self.probe.close()
        self.watch.close()
        self.ranks.close()

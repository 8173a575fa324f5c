"""``replay.Recorder``: wraps the training loop and records what replay needs, at no visible cost.

Per step, on the training thread: the RNG states (captured after the batch was fetched, right
before the step), a copy of the batch, the param-group hyper-parameters and module modes; after
the step, the loss, the gradient norm measured in an optimizer step pre-hook and a parameter
fingerprint. On a CPU run the step's record goes straight into the shared step log that the
writer process reads (``step_log_writer.py``): safe once ``step`` returns. Nothing here reads a
device value: a step's health goes to the host in one non-blocking copy (``inflight.py``), and a
GPU step is handed to the writer thread once that copy and its batch's are done.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import sys
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..capture.fingerprint import loss_of
from ..capture.guard import (
    LiveProgram,
    PreflightStop,
    ReplayFinished,
    preflight_from_env,
    refuse_if_replaying,
    take_over,
    takes_over_at_first_step,
)
from ..capture.numerics import warn_unless_bitwise
from ..capture.objects import RunObjects, objects_from_build
from ..capture.sharded import layout
from ..capture.tensors import tree_nbytes
from ..errors import NonFiniteLossError, RecorderWarning, user_line, warn_at_user_line
from ..ranks.context import detect, shared_run_id, unwrap
from ..ranks.names import base_path, rank_path
from ..ranks.policy import DdpRanks
from ..ranks.votes import Verdict
from ..store.contracts import (
    ModelMeta,
    ModuleMeta,
    ParamMeta,
    RunMeta,
)
from ..store.layout import FORMAT_VERSION
from ..store.segments import segment_path
from ..store.writer import RingSpec
from ..store.writer_process import WriterClient
from ..trust import sign, signed_payload, user_key
from . import active
from .batch_refs import BatchRefs
from .config import RecorderConfig
from .ending import ending
from .entry import (
    StepFunction,
    describe_entry,
    describe_program,
    describe_step,
    read_source,
    started_by_multiprocessing,
)
from .env import collect_env
from .inflight import PendingStep
from .lifecycle import Lifecycle
from .selfcheck import SelfCheckLauncher, enabled_by_env, skip_reason
from .snapshots import pow2
from .step_capture import StepCapture
from .transport import Transport

__all__ = ["Recorder"]


@dataclass(slots=True)
class _FileFacts:
    """What the file is made with at its first commit, read on the training thread at start."""

    key: bytes | None  # this user's signing key (replay/trust.py)
    model: ModelMeta | None = None
    fsdp: Any = None  # FSDP2: how the model is sharded, for meta.distributed.fsdp


_NO_STEP = (
    "replay: this step has no step function: hand it over with the batch, "
    "replay.step(batch, step_fn) or rec.step(batch, step_fn), or make the Recorder with "
    "step_fn= (docs/recording.md)"
)


class Recorder:
    """Record a training run into ``path`` so that ``replay bisect`` can replay its last stretch.

    Example::

        with replay.Recorder("run.h5", model=model, optimizer=opt,
                             step_fn=train_step, build_fn=build) as rec:
            for batch in loader:
                loss = rec.step(batch)

    ``step_fn(model, optimizer, batch)`` is your whole training step (zero_grad, forward, backward,
    optimizer step) and returns the loss; ``build_fn()`` returns ``(model, optimizer)`` or
    ``(model, optimizer, scheduler[, scaler])``. Both must be module-level functions: replay
    imports them again by name (a lambda or closure is refused here, with the reason).

    Defaults: a snapshot of model/optimizer/scheduler/scaler state every ``snapshot_every=50``
    steps and at the first step, kept in tiers (``store/retention.py``): every 50 steps for the
    last ``keep_snapshots * snapshot_every = 150``, every 500 for the last 5,000, every 5,000
    beyond; the batch ring holds every step back to the oldest kept snapshot, so any step of the
    last ``reach=10_000`` is replayable. Step records are bounded by ``keep_bytes=1 GiB`` (sized
    from the first step's batch): a larger batch keeps fewer steps, and the file says how many
    (``replay info``'s reach line). ``reach=0`` keeps only the dense tier: the last 101 to 150
    steps, and bisect replays at most 51 steps. ``loader=``: the ``DataLoader`` the batches come
    from (map-style dataset, no ``build_fn``): each step keeps the sampler's indices and a digest
    of its batch instead of the batch, and replay draws it again from the dataset, refusing a
    batch that changed (``by_reference=False`` keeps the bytes; docs/recording.md).
    The parameter fingerprint (bitwise replay verification, parameter NaN flag) is taken every
    ``fingerprint_every=10`` steps; loss and gradient norm every step. Health metrics are kept for the last
    ``keep_health=100_000`` steps. The file stops growing once the rings are full.

    The steps go to the file in the background, through a child process (the writer process).
    On a CPU run each step is written into a shared-memory step log before ``step`` returns, so
    a ``kill -9`` of the training process loses at most the step in flight; when the writer
    process falls behind and the log is full, training waits for room. A step with tensors on a
    GPU goes through a writer thread instead, and training waits for that thread once
    ``max_pending_steps=64`` steps are handed over and not yet passed on, the oldest of them at
    least ``max_pending_seconds=1.0`` ago (or once ``max_pending_bytes=1 GiB`` are): a ``kill
    -9`` then loses at most that backlog. Either wait is announced by one
    :class:`RecorderWarning`.

    **DDP** (detected; ``rank=``/``world_size=`` override it) and **FSDP2**: every rank records
    its own file, ``run.rank0.h5``, ``run.rank1.h5``, ...; snapshots hold the inner module's
    state (FSDP2: this rank's shards), so ``build_fn`` returns the plain model; the ranks stop
    together when one goes bad, their votes riding DDP's own all-reduce (``replay/ranks/``;
    docs/recording.md says what each rank records and when the ranks stop).

    A step whose loss is NaN/Inf is recorded and then :class:`replay.NonFiniteLossError` is raised
    (``raise_on_nonfinite=False`` keeps training; on a GPU the check runs one step late so that it
    never syncs). A step that raises is recorded with its exception, flushed, and the exception
    re-raised unchanged. A write failure (disk full, permissions) stops recording with one
    :class:`RecorderWarning`; training goes on.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        step_fn: Callable[..., Any] | None = None,
        build_fn: Callable[..., Any] | None = None,
        scheduler: Any = None,
        scaler: Any = None,
        objects: Mapping[str, Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        loader: Any = None,
        by_reference: bool = True,
        build_kwargs: Mapping[str, Any] | None = None,
        not_replayable: str | None = None,
        config: RecorderConfig | None = None,
        **settings: Any,
    ) -> None:
        """``settings``: how often to snapshot, how much to keep, when training waits: the
        fields of :class:`replay.RecorderConfig`, its only list (``config=`` gives them all at
        once; a setting named here overrides it)."""
        refuse_if_replaying()  # before anything is started or created
        if step_fn is None and build_fn is not None:
            raise TypeError("Recorder: build_fn= needs step_fn= (replay imports both by name)")
        self._pending: Callable[[Callable[..., Any]], None] | None = None
        self._closed = self._warned = False
        self._step_error: BaseException | None = None
        self._made_at = user_line()  # (the program's line that made it)
        # exit and SIGTERM close the file (started at `with`, or at the first step)
        self._lifecycle = Lifecycle(self.close, self._close_again, lambda: self._closed)
        if step_fn is None and takes_over_at_first_step():
            # Replay re-running a program that hands its step function over at each step
            # (replay.step(batch, step_fn)): the take-over waits for the first one, which brings
            # it; then the objects, as they are by then, and that function are replay's.
            def at_first_step(fn: Callable[..., Any]) -> None:
                take_over(
                    lambda: self._live(objects, model, optimizer, scheduler, scaler, fn, loader)
                )

            self._pending = at_first_step
            active.opened(self)
            return
        # Replay re-running this program: hand it the live objects; it replays, then ends the
        # program (ReplayFinished) before any training. Nothing is recorded. (Without a step
        # function this only ends a program that caught ReplayFinished and went on.)
        take_over(lambda: self._live(objects, model, optimizer, scheduler, scaler, step_fn, loader))
        self.preflight = preflight_from_env()
        if self.preflight is not None:
            path = self.preflight.path
        self.config = RecorderConfig.of(config, settings).for_preflight(self.preflight)
        self.objects = self._objects(objects, model, optimizer, scheduler, scaler)
        self._steps = StepFunction(step_fn, self.objects)
        self._describe_entry(step_fn, build_fn, build_kwargs, not_replayable)
        warn_unless_bitwise(self.model)  # once, at start: a CUDA run's settings
        self.enabled = True
        self._capture: StepCapture | None = None  # the step's work (step_capture.py)
        self._self_check: SelfCheckLauncher | None = None
        # the file's run id: the self-check's verdict beside it names it (a verdict left by an
        # earlier recording at this path is not this one's)
        self.run_id = uuid.uuid4().hex
        # This user's key signs the file (replay/trust.py): read, or made, here on the training
        # thread, where its one warning belongs; a key that cannot be made leaves it unsigned.
        self._file = _FileFacts(self._signing_key())
        self.next_step = self.config.start_step
        # From here on nothing raises into training: an object the recorder does not know (an
        # optimizer wrapper without torch's hooks, a missing private attribute) turns recording
        # off with one warning, and the loop trains on unrecorded.
        try:
            self._capture = self._start(path, rank, world_size)
            # Batches by reference (capture/loader.py): the loader's sample indices and a digest
            # per step, drawn again on replay, which re-runs the program (so not with build_fn).
            if loader is not None and by_reference and build_fn is None:
                self._capture.refs = BatchRefs(loader)
            self._start_self_check(self._capture)
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self._off_from_the_start(path, e)
        if step_fn is not None:  # (one handed to rec.step is looked at there)
            self._say_unheld(step_fn)
        active.opened(self)  # replay.step reaches it (active.py)

    def _describe_entry(
        self,
        step_fn: Callable[..., Any] | None,
        build_fn: Callable[..., Any] | None,
        build_kwargs: Mapping[str, Any] | None,
        not_replayable: str | None,
    ) -> None:
        """How replay runs this program again (``meta.entry``): re-entry, or ``build_fn`` and
        ``step_fn`` imported by name; and why it cannot (``not_replayable``)."""
        self.program, no_program = describe_program()
        if build_fn is None:
            # (without a step function yet: described at the first step, which brings it)
            self.entry = {"step_fn": describe_step(step_fn)} if step_fn is not None else {}
            why = no_program if self.program is None else started_by_multiprocessing()
            if why is not None and not_replayable is None:
                not_replayable = f"no build_fn, and {why}"
                warnings.warn(
                    f"replay: {not_replayable}: replay cannot run it again, so this run's steps "
                    "will not replay; pass build_fn= (docs/recording.md)",
                    RecorderWarning,
                    stacklevel=3,
                )
        else:
            assert step_fn is not None  # (refused in __init__)
            self.entry = {
                "step_fn": describe_entry(step_fn, "step_fn"),
                "build_fn": describe_entry(build_fn, "build_fn"),
            }
        # Why this run's steps cannot be replayed (a framework feature replay does not rebuild):
        # then no snapshot is taken; the steps' health, batches and RNG states are recorded.
        self.not_replayable = not_replayable
        # Keyword arguments replay calls build_fn with (a framework integration's build needs
        # the user's class and settings): a class or function is recorded as an entry point
        # (imported on replay under the same rules as build_fn), anything else as JSON.
        self.build_kwargs: dict[str, Any] = {}
        for k, v in (build_kwargs or {}).items():
            if k in ("build_fn", "step_fn"):
                raise ValueError(f"build_kwargs: {k!r} is reserved")
            if isinstance(v, type) or inspect.isfunction(v):
                self.entry[k] = describe_entry(v, k)
            else:
                self.build_kwargs[k] = v

    def _start(
        self, path: str | os.PathLike[str], rank: int | None, world_size: int | None
    ) -> StepCapture:
        """The file's path, the objects' hooks, the writer process (started now: its imports
        overlap the first steps) and, under DDP, the ranks' agreement."""
        self.path = os.path.abspath(os.fspath(path))
        self.dist = detect(rank, world_size)
        self.base_path = self.path
        # A recording already there is kept: this run goes to the next segment (segments.py).
        mine = functools.partial(rank_path, rank=self.dist.rank) if self.dist else None
        if self.preflight is None:  # (a preflight writes its own scratch file)
            self.path = segment_path(self.path, mine)
        elif mine is not None:
            self.path = mine(self.path)
        if self.dist is not None:
            self.base_path = base_path(self.path) or self.path
            self.run_id = shared_run_id(self.dist, self.run_id, self.base_path)
        # What replay rebuilds with build_fn: the module inside a DDP wrapper. step_fn still
        # gets the wrapper, which is what the training loop passes.
        inner = unwrap(self.model)
        # FSDP2 (fully_shard): how, for meta.distributed.fsdp; snapshots keep local shards.
        self._file.fsdp = layout(inner) if self.dist is not None else None
        capture = StepCapture(self.config, self.objects, inner, self._give_up)
        capture.replayable = self.not_replayable is None
        model_bytes = sum(t.numel() * t.element_size() for t in inner.state_dict().values())
        # What the file says of the model, read here on the training thread: the writer thread
        # makes the file while training runs, and FSDP2 swaps a module's parameters for their
        # unsharded views during forward and backward (reading them from another thread then
        # failed at random: "setStorage ... out of bounds for storage of size 0").
        self._file.model = ModelMeta(
            cls=f"{type(inner).__module__}.{type(inner).__qualname__}",
            modules=tuple(ModuleMeta(n, type(m).__name__) for n, m in inner.named_modules()),
            params=tuple(
                ParamMeta(n, tuple(p.shape), str(p.dtype).removeprefix("torch."), p.requires_grad)
                for n, p in inner.named_parameters()
            ),
            param_bytes=model_bytes,
        )
        capture.transport = Transport(
            model_bytes,
            self.config,
            capture.watch.names,
            functools.partial(self._make_store, capture),
            self.path,
        )
        if self.dist is not None and self.dist.collective:
            capture.ranks = DdpRanks(
                self.dist,
                self.model,
                inner,
                self.objects.trained_params(),
                stop=self.config.raise_on_nonfinite,
                on_bad=self._raise_ranks_bad,
                # AMP skips steps with inf gradients by design: only the loss votes then
                grads_vote=self.scaler is None,
            )
        return capture

    def _start_self_check(self, capture: StepCapture) -> None:
        """The background self-check (docs/selfcheck.md): after the first steps, a child
        replays them and says at once, on stderr, when they do not replay."""
        if not (self.config.self_check and enabled_by_env() and self.preflight is None):
            return
        assert self._file.model is not None  # (_start made it)
        self._self_check = SelfCheckLauncher(
            self.path,
            self.run_id,
            self.config,
            4 * self._file.model.param_bytes,
            unwrap(self.model),
            skip_reason(self),
        )
        # One more snapshot half-way through the checked steps: the check replays the steps
        # after it from it, as a bisect of a later failure would start, which a replay carried
        # on from the first snapshot never tests (a batch an earlier step prefetched).
        half = self.config.start_step + self.config.self_check_steps // 2
        if (
            self._self_check.skip is None
            and half > self.config.start_step
            and not self.config.is_snapshot_step(half)
        ):
            capture.snapshots.extra = half

    def _off_from_the_start(self, path: str | os.PathLike[str], e: Exception) -> None:
        """A Recorder that could not start: ``step`` runs the step function, nothing else."""
        self.path = os.path.abspath(os.fspath(path))
        self.enabled = False
        self._capture = None
        self._self_check = None
        self._warned = True
        warnings.warn(
            f"replay: recording to {self.path} is off (starting the recorder failed: "
            f"{type(e).__name__}: {e}); training goes on unrecorded",
            RecorderWarning,
            stacklevel=3,
        )

    # -- the run's objects, and where its steps go ----------------------------------------------

    model = property(lambda self: self.objects.model)
    optimizer = property(lambda self: self.objects.optimizer)
    scheduler = property(lambda self: self.objects.scheduler)
    scaler = property(lambda self: self.objects.scaler)

    @property
    def transport(self) -> Transport | None:
        """How the steps reach the file (``None`` when recording could not start)."""
        return self._capture.transport if self._capture is not None else None

    @classmethod
    def _live(
        cls,
        objects: Mapping[str, Any] | None,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        scaler: Any,
        step_fn: Callable[..., Any] | None,
        loader: Any = None,
    ) -> LiveProgram:
        """What replay takes over when it re-runs this program: the objects with the plain
        module as ``model`` (what snapshots hold) and the wrapper the step runs through."""
        objs = cls._objects(objects, model, optimizer, scheduler, scaler)
        inner = unwrap(objs.model)
        wrapper = None if inner is objs.model else objs.model
        if wrapper is not None:
            objs = RunObjects({**objs.named, "model": inner}, objs.style)
        assert step_fn is not None  # (a Recorder without one takes over at its first step)
        return LiveProgram(objs, step_fn, wrapper, loader=loader)

    @staticmethod
    def _objects(
        objects: Mapping[str, Any] | None,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        scaler: Any,
    ) -> RunObjects:
        named = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
        if objects is not None:
            if given := [n for n, v in named.items() if v is not None]:
                raise TypeError(
                    f"Recorder: pass either objects= or {'/'.join(given)}=, not both "
                    "(objects= holds every named object, model and optimizer included)"
                )
            return objects_from_build(objects, "Recorder(objects=...)")
        if model is None:
            raise TypeError("Recorder needs model= (or objects= with a 'model')")
        return objects_from_build(named, "Recorder", style="positional")

    # -- context manager ----------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        if self._pending is None and not self._lifecycle.started:
            self._lifecycle.start(self.config.handle_signals)
        return self

    def __exit__(self, tp: object, e: BaseException | None, tb: object) -> None:
        self.close(ended_by=e)

    # -- the hot path -----------------------------------------------------------------------

    def step(self, batch: Any, step_fn: Callable[..., Any] | None = None, **values: Any) -> Any:
        """Run the step function on ``batch`` under recording; return what it returned.

        ``step_fn``: the step function, when the Recorder was made without one or the program
        makes it where the step is (a closure made again each epoch: the same code is the same
        step; replay runs every step with the one the first step was handed). ``values``:
        per-step values computed outside the step (``lr=lr``, ``it=it``) that the step function
        takes as parameters; they are recorded and handed back on replay.
        """
        if self._pending is not None:  # replay re-running the program takes over here
            if step_fn is None:
                raise TypeError(_NO_STEP)
            self._pending(step_fn)
            raise ReplayFinished()
        steps = self._steps
        if step_fn is not None and step_fn is not steps.fn:
            if steps.use(step_fn, self.objects, self.entry, self.next_step):
                self._say_unheld(step_fn)
        elif steps.call is None:
            raise TypeError(_NO_STEP)
        if not self._lifecycle.started:  # made without `with`: exit and SIGTERM close it too
            self._lifecycle.start(self.config.handle_signals)
        if self._capture is not None:
            self._capture.ranks.before_step()
        if steps.unheld.look_again_at is not None and self.next_step >= steps.unheld.look_again_at:
            steps.unheld.look_again()  # (a frozen-looking module the steps changed: said now)
        cap = self._ready()
        changed, steps.changed = steps.changed, None
        p = (
            cap.begin(self.next_step, batch, values, changed, steps.in_effect)
            if cap is not None
            else None
        )
        if p is None or cap is None:
            return self._unrecorded_step(batch, values)
        try:
            ret = steps.call(batch, values)  # type: ignore[misc]  # (None: refused above)
        except Exception as e:
            cap.end_probes()
            self._record_exception(cap, p, e)
            raise
        return self._finish(cap, p, ret)

    def _say_unheld(self, fn: Callable[..., Any]) -> None:
        """Once, when the step function is known: the models, optimizers and other state its
        code reaches that ``objects=`` does not hold (``unheld.py``)."""
        if self.not_replayable is None and self.enabled:
            self._steps.unheld.say(fn, self.objects, self.next_step + self.config.snapshot_every)

    # -- steps a framework runs (replay.integrations) ---------------------------------------

    def observe_begin(self) -> bool:
        """A framework that owns the loop (Lightning, Hugging Face) starts step ``next_step``.

        Everything a replay needs from before the step is taken now (the snapshot when one is
        due, RNG states, hyper-parameters, module modes, the scaler's scale); the batch and the
        result come with :meth:`observe_end`. The gradient norm is measured at
        :meth:`measure_grads` (or a clip, or the end), not at the optimizer's step: a framework
        that runs the backward inside ``optimizer.step(closure)`` would have it measured before
        the gradients exist. Returns whether the step is recorded.
        """
        cap = self._ready()
        if self._capture is not None:
            self._capture.observed = None
        if cap is None:
            return False
        try:
            p = cap.before(self.next_step, None)
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self._give_up("capturing the step", e)
            return False
        cap.observed = p
        cap.begin_probes(p, at_step=False)
        return True

    def measure_grads(self) -> None:
        """The step's gradients are complete and not yet clipped or applied: measure them."""
        cap = self._capture
        if cap is not None and cap.observed is not None:
            cap.probe.measure_now()
            if cap.watching:
                cap.watch.measure_now()

    def observe_end(
        self,
        batch: Any,
        values: Mapping[str, Any] | None = None,
        ret: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        """The step begun by :meth:`observe_begin` is over: record it with its ``batch`` (what
        the step function takes on replay), per-step ``values`` and what it returned (its loss),
        or the ``exception`` it raised. Raises :class:`replay.NonFiniteLossError` as ``step``
        does; nothing else."""
        cap = self._capture
        if cap is None or cap.observed is None:
            return
        p, cap.observed = cap.observed, None
        kept = dict(values or {})
        try:
            kept = cap.bounded(kept) if kept else kept
            if cap.snapshots.step_hint is None:  # the first step: the file is sized from it
                cap.snapshots.release(cap.transport, tree_nbytes(batch) + tree_nbytes(kept))
            cap.transport.capture(p, batch, kept, None, cap.hparams.others)
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            cap.end_probes()
            self._give_up("capturing the step", e)
            self.next_step = p.t + 1
            return
        if exception is not None:
            cap.end_probes()
            self._record_exception(cap, p, exception)
            return
        self._finish(cap, p, ret)

    def _record_exception(self, cap: StepCapture, p: PendingStep, e: BaseException) -> None:
        """The step raised ``e``: record it with its traceback and flush (the caller re-raises)."""
        self.next_step = p.t + 1
        self._step_error = e  # (the step's own: not how the program ended outside one)
        cap.raised(p, e)
        try:
            self._check_writer()
        except Exception as rec_error:  # noqa: BLE001 - the user's exception is the one to raise
            self._give_up("recording the exception", rec_error)

    def _finish(self, cap: StepCapture, p: PendingStep, ret: Any) -> Any:
        """After the step returned ``ret``: its health launched to the host; the steps whose
        health is there are passed on, and the non-finite check reads them."""
        settled = cap.finish(p, ret)
        self.next_step = p.t + 1
        if settled is None:  # (recording failed: the other ranks still wait for this one's vote)
            cap.ranks.after_step(p.t, p.loss, p.local_gn)
            return ret
        if self._self_check is not None:
            self._self_check.after_step(p.t)  # starts a child once; never waits
        cap.pass_on(settled)
        if p.t == self.config.start_step:
            # Once, at the first step: wait until the file exists and holds what was passed on
            # (the writer process starting up, about 0.3 s), so a crash right after still leaves
            # a file. A step still in flight is not waited for.
            cap.transport.flush()
            self._check_writer()
        if cap.ranks.agrees:
            cap.ranks.after_step(p.t, p.loss, p.local_gn)
        if cap.bad is not None:
            self._raise_if_bad()
        return ret

    def _give_up(self, what: str, e: Exception) -> None:
        """Recording fails on the training thread: stop it, say so once, keep training."""
        self._stop(
            f"{what} failed: {type(e).__name__}: {e}",
            "training goes on, and the steps flushed before stay readable",
        )

    def _stop(self, why: str, after: str) -> None:
        """Recording stops: said once, as one :class:`RecorderWarning` at the caller's caller."""
        self.enabled = False
        if not self._warned:
            self._warned = True
            # at the program's line (a fixed stacklevel named recorder.py when the writer's
            # failure was found by rec.step's check of it)
            warn_at_user_line(f"replay: recording to {self.path} stopped ({why}); {after}")

    def _unrecorded_step(self, batch: Any, values: dict[str, Any]) -> Any:
        """Recording stopped (write failure): train on, but still join the ranks' agreement,
        or the other ranks would wait for this one forever."""
        ret = self._steps.call(batch, values)  # type: ignore[misc]  # (step() saw to it)
        ranks = self._capture.ranks if self._capture is not None else None
        if ranks is not None and ranks.agrees:
            ranks.after_step(self.next_step, loss_of(ret), ranks.local_grad_norm())
        self.next_step += 1
        return ret

    def _raise_ranks_bad(self, verdict: Verdict, loss: Any) -> None:
        value = float(loss) if isinstance(loss, (torch.Tensor, float, int)) else math.nan
        if self.enabled:
            self.flush()
        raise NonFiniteLossError(
            verdict.step,
            value,
            self.path,
            ranks=verdict.ranks,
            bisect_path=self.base_path,
            stopped_at=verdict.stopped_at,
        )

    def _ready(self) -> StepCapture | None:
        """Before a step: a preflight's last step ends the run; what the writer reports is said;
        the steps whose health copies are done are passed on, and checked (a GPU step's loss is
        so read a step late, or later: never waited for). The capture, while recording."""
        if self.preflight is not None and self.next_step >= self.preflight.steps + (
            self.config.start_step
        ):
            # ``replay preflight`` asked for this many steps: close the file and end the run
            # (also when recording stopped: preflight ends the run anyway)
            self.close()
            print(
                f"replay preflight: recorded {self.preflight.steps} steps to {self.path}; "
                "ending the run",
                file=sys.stderr,
                flush=True,
            )
            raise PreflightStop()
        cap = self._capture
        if not self.enabled or cap is None:
            return None
        self._check_writer()
        if cap.bad is not None:
            self._raise_if_bad()  # (one a flush settled)
        settled = cap.inflight.ready() if cap.inflight.queue else None
        if settled:
            cap.pass_on(settled)
            self._raise_if_bad()
        return cap if self.enabled else None

    def _raise_if_bad(self) -> None:
        """Raise :class:`NonFiniteLossError` for the first settled step whose loss is NaN/Inf:
        in that step on the CPU, a step or more late on a GPU (when its copy is done)."""
        cap = self._capture
        if cap is not None and cap.bad is not None:
            (t, loss), cap.bad = cap.bad, None
            self.flush()
            raise NonFiniteLossError(t, loss, self.path)

    # -- the store --------------------------------------------------------------------------

    @staticmethod
    def _signing_key() -> bytes | None:
        try:
            return user_key(create=True)
        except (OSError, ValueError) as e:
            warnings.warn(
                f"replay: this recording will be unsigned ({e}): replaying it will need --trust "
                "or `replay trust` (docs/trust.md)",
                RecorderWarning,
                stacklevel=4,
            )
            return None

    def _signed(self, meta: RunMeta, sources: dict[str, str]) -> RunMeta:
        """``meta`` with its signature (docs/trust.md): over the blob as the file will hold it."""
        if self._file.key is None:
            return meta
        try:
            blob = json.loads(json.dumps(meta.to_json()))
            payload = signed_payload(
                blob, json.loads(json.dumps(sources)), self.run_id, FORMAT_VERSION
            )
            return dataclasses.replace(meta, signature=sign(payload, self._file.key))
        except (TypeError, ValueError):  # a value JSON cannot hold: the file is refused anyway
            return meta

    def _make_store(self, capture: StepCapture, client: WriterClient) -> WriterClient:
        """Runs on the writer thread at the first commit, when sizes are known: the file,
        created through ``client`` with the run's metadata and sources."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        assert self._file.model is not None  # (_start made it)
        model_bytes = self._file.model.param_bytes
        plan = capture.snapshots.plan()
        meta = RunMeta(
            config=self.config.meta(plan),
            entry=self.entry,
            env=collect_env(self._file.key),
            model=self._file.model,
            optimizer=type(self.optimizer).__name__ if self.optimizer else None,
            objects=self.objects.describe(),
            scheduler=type(self.scheduler).__name__ if self.scheduler else None,
            scaler=type(self.scaler).__name__ if self.scaler else None,
            distributed=None
            if self.dist is None
            else {**self.dist.meta(), **({"fsdp": self._file.fsdp} if self._file.fsdp else {})},
            build_kwargs=self.build_kwargs or None,
            not_replayable=self.not_replayable,
            program=self.program,
            reach=plan.meta(),
        )
        paths = [e["path"] for e in self.entry.values()] + [(self.program or {}).get("path")]
        sources = {p: text for p in paths if p and (text := read_source(p)) is not None}
        meta = self._signed(meta, sources)
        # A step's record: the batch (sized at the first step, when the loop handed one over)
        # and about 16 KiB of RNG states and manifest. Chunks of about a quarter of it: each
        # chunk is one write call in the writer process (a 146 KB step in 16 KiB chunks cost 33
        # us there, in 64 KiB chunks 16 us), and a slot wastes at most one chunk's padding.
        step_guess = capture.snapshots.step_guess()
        snap_guess = 4 * model_bytes + 4096  # weights, Adam's two moments, pending gradients
        return client.create(
            self.path,
            run_id=self.run_id,
            meta=meta,
            sources=sources,
            steps=RingSpec(plan.step_slots, pow2(step_guess // 4, 16 << 10, 1 << 20), step_guess),
            snapshots=RingSpec(plan.snapshot_slots, pow2(snap_guess, 4096, 1 << 20), snap_guess),
            health_slots=self.config.health_slots(plan.step_slots),
            watched=capture.watch.names,
        )

    def flush(self, timeout: float | None = 60.0) -> None:
        """Wait until every recorded step is on disk (a step whose health is still on its way
        from the device waited for too; a non-finite loss among them raises at the next step)."""
        cap = self._capture
        if cap is not None:
            cap.drain()
            cap.transport.flush(timeout)
            self._check_writer()

    def _check_writer(self) -> None:
        """Before every step: what the writer reports (a wait, once; a failure, which stops
        recording), said as one :class:`RecorderWarning` each."""
        cap = self._capture
        found = cap.transport.check(self.next_step) if cap is not None else None
        if found is None:
            return
        if found.wait is not None:
            warn_at_user_line(found.wait)  # (from _ready or a close: no fixed stacklevel)
        if found.stopped is not None:
            self._stop(found.stopped, found.after)

    def close(self, ended_by: BaseException | None = None) -> None:
        """Flush and close the file. Idempotent; called on exit, SIGTERM and interpreter exit.
        ``ended_by``: the exception ending the program, which the file keeps when no step
        raised it (``record/ending.py``; the ``with`` block's, or an uncaught one's)."""
        active.closed(self)
        if self._pending is not None or self._closed:
            return
        self._closed = True
        ended = None
        if ended_by is not None and ended_by is not self._step_error:
            if not isinstance(ended_by, NonFiniteLossError):  # (a step's, raised here)
                last = self.next_step - 1 if self.next_step > self.config.start_step else None
                try:
                    ended = ending(ended_by, last)
                except Exception:  # noqa: BLE001 - (an exception whose str() raises)
                    ended = None
        cap = self._capture
        try:
            if cap is not None:
                cap.close()
        finally:
            try:
                if cap is not None:
                    cap.drain()
                    cap.transport.close(ended)
                    self._check_writer()
            finally:
                self._lifecycle.end()
                # a run that failed is bisected next, and bisect checks that it replays
                failed = ended is not None or (cap is not None and cap.failed)
                if self._self_check is not None and not failed:
                    self._self_check.at_close(self._made_at)

    def _close_again(self) -> None:
        if self._capture is not None:
            self._capture.transport.close_again()

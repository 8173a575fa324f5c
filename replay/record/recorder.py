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
import time
import traceback
import types
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ..capture.bounded import unrecorded, value_excess
from ..capture.fingerprint import absmax, exact_if_needed, loss_of, param_fingerprint
from ..capture.guard import (
    LiveProgram,
    PreflightStop,
    ReplayFinished,
    preflight_from_env,
    refuse_if_replaying,
    take_over,
    takes_over_at_first_step,
)
from ..capture.hparams import HyperParams
from ..capture.numerics import warn_unless_bitwise
from ..capture.objects import RunObjects, StepCall, objects_from_build, optimizers, run_params
from ..capture.probe import GradProbe
from ..capture.readback import value_now
from ..capture.rng import capture_rng
from ..capture.sharded import layout
from ..capture.tensors import CopyStats, tree_nbytes
from ..capture.watch import ObjectWatch
from ..errors import NonFiniteLossError, RecorderWarning
from ..ranks.context import detect, shared_run_id, unwrap
from ..ranks.names import base_path, rank_path
from ..ranks.policy import DdpRanks, RankPolicy, SingleProcess
from ..ranks.votes import Verdict
from ..store.contracts import (
    ModelMeta,
    ModuleMeta,
    ParamMeta,
    RunMeta,
    StepException,
)
from ..store.layout import FORMAT_VERSION
from ..store.segments import segment_path
from ..store.writer import RingSpec
from ..store.writer_process import WriterClient
from ..trust import sign, signed_payload, user_key
from . import active
from .batch_refs import BatchRefs
from .config import RecorderConfig
from .entry import describe_entry, describe_program, describe_step, read_source
from .env import collect_env
from .inflight import InFlight, Settled
from .lifecycle import Lifecycle
from .selfcheck import SelfCheckLauncher, enabled_by_env, skip_reason
from .snapshots import Snapshots, pow2
from .transport import Transport
from .writer_thread import StepJob

__all__ = ["Recorder"]


def _looks_bad(loss: Any, gn: torch.Tensor | None) -> bool:
    """Where reading is free (host memory, ``readback.value_now``; a device's value is never
    waited for): a NaN/Inf loss or gradient norm at this step.

    Then the parameters are checked too, whatever ``fingerprint_every`` says: the step that went
    bad is the one whose parameter flag matters. (The norm first: ``value_now`` has its value
    still, read by the gradient probe.)
    """
    for v in (gn, loss):
        if isinstance(v, torch.Tensor):
            v = value_now(v)
        if isinstance(v, float) and not math.isfinite(v):
            return True
    return False


_SMALL = frozenset({int, float, bool, type(None)})  # per-step values no limit can refuse

_NO_STEP = (
    "replay: this step has no step function: hand it over with the batch, "
    "replay.step(batch, step_fn) or rec.step(batch, step_fn), or make the Recorder with "
    "step_fn= (docs/recording.md)"
)


def _code_of(fn: Callable[..., Any] | None) -> Any:
    """The code object that makes ``fn`` the step it is: a closure made again each epoch has
    the same one (``None`` for a callable without one: a partial, an object with __call__)."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    return fn.__code__ if isinstance(fn, types.FunctionType) else None


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

    **DDP** (``torch.distributed`` initialised with more than one rank, detected automatically;
    ``rank=``/``world_size=`` override it): every rank records its own file, named from ``path``:
    ``run.h5`` -> ``run.rank0.h5``, ``run.rank1.h5``, ... (``meta.distributed`` holds rank,
    world size, backend and local rank). ``model`` may be the ``DistributedDataParallel`` wrapper:
    snapshots hold its inner module's state (no ``module.`` prefix), so ``build_fn`` returns the
    plain model and a single process replays any rank. The recorder registers a DDP communication
    hook that measures this rank's own gradient norm before the all-reduce (health columns
    ``local_grad_norm``, ``local_grad_nonfinite``) and appends each rank's stop vote to DDP's own
    last all-reduce of the step (no extra collective): a rank whose own gradients go non-finite
    makes every rank raise :class:`replay.NonFiniteLossError` at the end of that step, naming the
    bad ranks; a non-finite loss with finite gradients votes at the next reduction, so every rank
    raises one step later, naming the step it went bad at (after a run's last step nothing
    follows to carry it: that rank warns at close). Under the user's own comm hook (or
    without a DDP wrapper) the ranks agree on the loss alone, with one extra tiny all-reduce per
    step (a warning says so). Open the rank set with ``replay info run.h5`` /
    ``replay bisect run.h5``. A step that *raises* on one rank cannot be agreed on (see
    ``replay/ranks/votes.py``).

    **FSDP2** (``model`` sharded with ``torch.distributed.fsdp.fully_shard``, the optimizer made
    over its sharded parameters; ``build_fn`` returns the plain model and its optimizer): each
    rank's snapshots keep only its own shards, never gathered (``replay/capture/sharded.py``),
    and ``meta.distributed.fsdp`` says how to shard the model again on replay. ``grad_norm``
    and ``param_fingerprint`` are the rank's own shards'.

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
        self._life = False  # the lifecycle (exit and SIGTERM close the file) started
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
        model, optimizer = self.objects.model, self.objects.optimizer
        scheduler, scaler = self.objects.scheduler, self.objects.scaler
        # The step function: given here, or at each step (rec.step(batch, step_fn)), where a
        # closure made again each epoch is the same step (the same code) as the first one.
        self._call = StepCall(step_fn, self.objects) if step_fn is not None else None
        self._step_code = _code_of(step_fn)
        self._other_step_said = False
        self._describe_entry(step_fn, build_fn, build_kwargs, not_replayable)
        warn_unless_bitwise(model)  # once, at start: a CUDA run's settings
        self.enabled = True
        self._closed = self._warned = False
        self._lifecycle = Lifecycle(self.close, self._close_again, lambda: self._closed)
        self._ranks: RankPolicy = SingleProcess()
        self._self_check: SelfCheckLauncher | None = None
        # the file's run id: the self-check's verdict beside it names it (a verdict left by an
        # earlier recording at this path is not this one's)
        self.run_id = uuid.uuid4().hex
        # This user's key signs the file (replay/trust.py): read, or made, here on the training
        # thread, where its one warning belongs; a key that cannot be made leaves it unsigned.
        self._key = self._signing_key()
        self.next_step = self.config.start_step
        # From here on nothing raises into training: an object the recorder does not know (an
        # optimizer wrapper without torch's hooks, a missing private attribute) turns recording
        # off with one warning, and the loop trains on unrecorded.
        try:
            self._start(path, model, optimizer, scheduler, scaler, rank, world_size)
            # Batches by reference (capture/loader.py): the loader's sample indices and a digest
            # per step, drawn again on replay, which re-runs the program (so not with build_fn).
            self._refs = (
                BatchRefs(loader)
                if loader is not None and by_reference and build_fn is None
                else None
            )
            self._start_self_check()
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self._off_from_the_start(path, e)
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
        self._fn = step_fn  # the function the last step was handed
        # Without build_fn, replay runs the program again and takes over here (re-entry); with
        # it, replay imports build_fn and step_fn by name (no program set-up to redo).
        self.program, self._no_program = describe_program()
        if build_fn is None:
            # (without a step function yet: described at the first step, which brings it)
            self.entry = {"step_fn": describe_step(step_fn)} if step_fn is not None else {}
            if self.program is None and not_replayable is None:
                not_replayable = f"no build_fn, and {self._no_program}"
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
        self,
        path: str | os.PathLike[str],
        model: Any,
        optimizer: Any,
        scheduler: Any,
        scaler: Any,
        rank: int | None,
        world_size: int | None,
    ) -> None:
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
        self.model, self.optimizer = model, optimizer
        # What replay rebuilds with build_fn: the module inside a DDP wrapper. step_fn still
        # gets the wrapper, which is what the training loop passes.
        self._inner = unwrap(model)
        # FSDP2 (fully_shard): how, for meta.distributed.fsdp; snapshots keep local shards.
        self._fsdp = layout(self._inner) if self.dist is not None else None
        self.scheduler, self.scaler = scheduler, scaler
        self._modules = [m for _, m in self._inner.named_modules()]
        self._params = [p for p in self._inner.parameters()]
        # requires_grad of every parameter, into the step record where it changed (gradual
        # unfreezing between steps: a replay from an earlier snapshot freezes them again)
        self._run_params = run_params(self.objects, self._inner)
        self._trainable: list[bool] | None = None
        self._trainable_record: np.ndarray | None = None
        self._opt_params = self.objects.trained_params()
        self._probe_grads = GradProbe(self._opt_params, optimizer)
        # Every other model and optimizer among the objects (a GAN's netG and optG).
        self._watch = ObjectWatch(self.objects, self._inner)
        self._snapshots = Snapshots(self.config, self.objects, self._inner)
        model_bytes = sum(t.numel() * t.element_size() for t in self._inner.state_dict().values())
        # What the file says of the model, read here on the training thread: the writer thread
        # makes the file while training runs, and FSDP2 swaps a module's parameters for their
        # unsharded views during forward and backward (reading them from another thread then
        # failed at random: "setStorage ... out of bounds for storage of size 0").
        self._model_meta = ModelMeta(
            cls=f"{type(self._inner).__module__}.{type(self._inner).__qualname__}",
            modules=tuple(ModuleMeta(n, type(m).__name__) for n, m in self._inner.named_modules()),
            params=tuple(
                ParamMeta(n, tuple(p.shape), str(p.dtype).removeprefix("torch."), p.requires_grad)
                for n, p in self._inner.named_parameters()
            ),
            param_bytes=model_bytes,
        )
        self.transport = Transport(
            model_bytes, self.config, self._watch.names, self._make_store, self.path
        )
        self._warned_values: set[str] = set()  # per-step values left out (too large): said once
        # steps whose health is on its way to the host (a GPU's: read when its event says so)
        self._inflight = InFlight()
        self._bad_unraised: tuple[int, float] | None = None  # settled by a flush: raised next
        self._observed: Any = None  # observe_begin's capture, until observe_end
        self._hp = HyperParams(optimizer, optimizers(self.objects))  # every optimizer's
        self._cuda_built = torch.cuda.is_available()  # ~16 us a call inside a training loop
        if self.dist is not None and self.dist.collective:
            self._ranks = DdpRanks(
                self.dist,
                model,
                self._inner,
                self._opt_params,
                stop=self.config.raise_on_nonfinite,
                on_bad=self._raise_ranks_bad,
                # AMP skips steps with inf gradients by design: only the loss votes then
                grads_vote=scaler is None,
            )

    def _start_self_check(self) -> None:
        """The background self-check (docs/selfcheck.md): after the first steps, a child
        replays them and says at once, on stderr, when they do not replay."""
        if not (self.config.self_check and enabled_by_env() and self.preflight is None):
            return
        self._self_check = SelfCheckLauncher(
            self.path,
            self.run_id,
            self.config.start_step,
            self.config.self_check_steps,
            self.config.self_check_budget,
            4 * self._model_meta.param_bytes,
            self._inner,
            skip_reason(self),
            later=self.config.start_step + self.config.keep_snapshots * self.config.snapshot_every,
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
            self._snapshots.extra = half

    def _off_from_the_start(self, path: str | os.PathLike[str], e: Exception) -> None:
        """A Recorder that could not start: ``step`` runs the step function, nothing else."""
        self.path = os.path.abspath(os.fspath(path))
        self.enabled = False
        self._ranks = SingleProcess()
        self._probe_grads = GradProbe([], None)
        self._watch = ObjectWatch.empty()
        self._self_check = None
        self._refs = None
        self.transport = None  # type: ignore[assignment]  # (enabled is False: never read)
        self.next_step = self.config.start_step
        self._warned = True
        warnings.warn(
            f"replay: recording to {self.path} is off (starting the recorder failed: "
            f"{type(e).__name__}: {e}); training goes on unrecorded",
            RecorderWarning,
            stacklevel=3,
        )

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
        if objects is not None:
            given = [
                n
                for n, v in (
                    ("model", model),
                    ("optimizer", optimizer),
                    ("scheduler", scheduler),
                    ("scaler", scaler),
                )
                if v is not None
            ]
            if given:
                raise TypeError(
                    f"Recorder: pass either objects= or {'/'.join(given)}=, not both "
                    "(objects= holds every named object, model and optimizer included)"
                )
            return objects_from_build(objects, "Recorder(objects=...)")
        if model is None:
            raise TypeError("Recorder needs model= (or objects= with a 'model')")
        named = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
        return objects_from_build(named, "Recorder", style="positional")

    # -- context manager ----------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        if self._pending is None and not self._life:
            self._life = True
            self._lifecycle.start(self.config.handle_signals)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        if step_fn is not None and step_fn is not self._fn:
            self._use(step_fn)
        elif self._call is None:
            raise TypeError(_NO_STEP)
        if not self._life:  # made without `with`: exit and SIGTERM close the file all the same
            self._life = True
            self._lifecycle.start(self.config.handle_signals)
        self._ranks.before_step()
        if (
            self.preflight is not None
            and self.next_step - self.config.start_step >= self.preflight.steps
        ):
            self._end_preflight()  # (also when recording stopped: preflight ends the run anyway)
        if self.enabled:
            self._check_writer()
            self._settle_ready()
        if not self.enabled:
            return self._unrecorded_step(batch, values)
        t = self.next_step
        copied = CopyStats()
        try:
            kept = self._bounded(values) if values else values  # what the record holds
            ref = self._refs.reference(batch) if self._refs is not None else None
            if self._snapshots.step_hint is None:  # the first step's size shapes the file
                self._snapshots.step_hint = (tree_nbytes(batch) if ref is None else 0) + (
                    tree_nbytes(kept)
                )
            rng, hparams, modes, health, scale = self._before_step(t, copied, values.get("lr"))
            direct, job = self.transport.capture(
                t,
                rng,
                hparams,
                modes,
                health,
                None if ref else batch,
                kept,
                copied,
                ref,
                self._trainable_record,
                self._hp.others,
            )
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self._give_up("capturing the step", e)
            return self._unrecorded_step(batch, values)
        t0 = time.perf_counter()
        self._probe_grads.begin()
        if self._watch:
            self._watch.begin()
        assert self._call is not None  # (step() saw to it)
        try:
            ret = self._call(batch, values)
        except Exception as e:
            self._probe_grads.end(measure=False)
            if self._watch:
                self._watch.end(measure=False)
            self._record_exception(t, job, direct, health, t0, copied, e)
            raise
        return self._finish(t, job, direct, health, ret, t0, scale, copied)

    @property
    def step_fn(self) -> Callable[..., Any] | None:
        """The step function: the one given here, or the one the last step was handed."""
        return self._fn

    def _use(self, fn: Callable[..., Any]) -> None:
        """``fn`` was handed to this step: the step function from now on. The same code as the
        first one's (a closure made again) keeps the plan of its call; the first one is
        described in the recording; another function is said once."""
        code = _code_of(fn)
        self._fn = fn
        if self._call is not None and code is not None and code is self._step_code:
            self._call = self._call.with_step(fn)
            return
        call = StepCall(fn, self.objects)  # (a step that takes no batch: EntryPointError)
        if self._call is None:
            self._call, self._step_code = call, code
            if "build_fn" not in self.entry:
                self.entry["step_fn"] = describe_step(fn)
            self._say_unheld(fn)
            return
        self._call = call
        if not self._other_step_said:
            self._other_step_said = True
            first = self.entry.get("step_fn", {}).get("qualname", "the first")
            warnings.warn(
                f"replay: step {self.next_step} was handed another step function "
                f"({getattr(fn, '__qualname__', type(fn).__name__)}) than the first step "
                f"({first}); a replay runs every step with the one its first step is handed, so "
                "steps made by another function will not replay",
                RecorderWarning,
                stacklevel=3,
            )

    def _say_unheld(self, fn: Callable[..., Any]) -> None:
        """Once, when the step function is known: the models, optimizers and other state its
        code reaches that ``objects=`` does not hold, named in one warning (no snapshot holds
        them, so no replay can start from one)."""
        if self.not_replayable is not None or not self.enabled:
            return
        from ..engine.suspects import unheld_state

        try:
            found = unheld_state(fn, self.objects)
        except Exception:  # noqa: BLE001 - naming them helps; it must not stop training
            return
        if found:
            warnings.warn(
                "replay: the step reads state the Recorder does not hold: "
                + ", ".join(s.describe() for s in found[:6])
                + ("; ..." if len(found) > 6 else "")
                + "; give it to objects= (no snapshot holds it, so a replay cannot start from one)",
                RecorderWarning,
                stacklevel=4,
            )

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
        if (
            self.preflight is not None
            and self.next_step - self.config.start_step >= self.preflight.steps
        ):
            self._end_preflight()
        if self.enabled:
            self._check_writer()
            self._settle_ready()
        if not self.enabled:
            self._observed = None
            return False
        t = self.next_step
        copied = CopyStats()
        try:
            rng, hparams, modes, health, scale = self._before_step(t, copied, None)
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self._give_up("capturing the step", e)
            self._observed = None
            return False
        self._observed = (t, rng, hparams, modes, health, scale, copied, time.perf_counter())
        self._probe_grads.begin(at_step=False)
        if self._watch:
            self._watch.begin(at_step=False)
        return True

    def measure_grads(self) -> None:
        """The step's gradients are complete and not yet clipped or applied: measure them."""
        if self._observed is not None:
            self._probe_grads.measure_now()
            if self._watch:
                self._watch.measure_now()

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
        if self._observed is None:
            return
        t, rng, hparams, modes, health, scale, copied, t0 = self._observed
        self._observed = None
        values = dict(values or {})
        try:
            values = self._bounded(values) if values else values
            direct, job = self.transport.capture(
                t,
                rng,
                hparams,
                modes,
                health,
                batch,
                values,
                copied,
                None,
                self._trainable_record,
                self._hp.others,
            )
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self._probe_grads.end(measure=False)
            self._watch.end(measure=False)
            self._give_up("capturing the step", e)
            self.next_step = t + 1
            return
        if exception is not None:
            self._probe_grads.end(measure=False)
            self._watch.end(measure=False)
            self._record_exception(t, job, direct, health, t0, copied, exception)
            return
        self._finish(t, job, direct, health, ret, t0, scale, copied)

    def _before_step(
        self, t: int, copied: CopyStats, lr: Any
    ) -> tuple[Any, Any, list[bool], dict[str, Any], Any]:
        """What a replay needs from before step ``t`` runs: the snapshot when one is due, RNG
        states, hyper-parameters, module modes, and the health row begun (lr, the scaler's
        scale). ``lr``: the loop's own value, for a run without an optimizer."""
        if self.not_replayable is not None:
            self.transport.writer_or_start()  # (it creates the file; the log's records wait)
        elif self._snapshots.due(t):
            self._snapshots.take(t, self.transport)
        rng = capture_rng()
        hparams = self._hp.take(copied)
        lr = hparams[0].get("lr") if hparams else lr
        health: dict[str, Any] = {
            "lr": lr if isinstance(lr, (int, float, torch.Tensor)) else None,
            "raised": 0.0,
        }
        modes = [m.training for m in self._modules]
        flags = [p.requires_grad for p in self._run_params]
        if flags != self._trainable:
            if self._trainable is not None:  # unfrozen between steps: a new group, maybe
                self._watch_trained()
            self._trainable, self._trainable_record = flags, np.asarray(flags, dtype=bool)
        else:
            self._trainable_record = None
        scale = getattr(self.scaler, "_scale", None) if self.scaler is not None else None
        if scale is not None:
            health["scale"] = scale.detach().clone()
        return rng, hparams, modes, health, scale

    def _watch_trained(self) -> None:
        """The gradient norm over what the optimizer updates now: a param group the loop added
        (``add_param_group`` when it unfreezes a backbone) is measured too."""
        now = self.objects.trained_params()
        if [id(p) for p in now] != [id(p) for p in self._opt_params]:
            self._opt_params = now
            self._probe_grads.watch(now)

    def _bounded(self, values: dict[str, Any]) -> dict[str, Any]:
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
                warnings.warn(
                    f"replay: the per-step value {name!r} ({type(v).__name__}) is {why}, beyond "
                    "what a step record holds (replay.capture.bounded.VALUE_LIMITS); it is "
                    "recorded as left out, training goes on, and a replay whose step function "
                    "takes it refuses",
                    RecorderWarning,
                    stacklevel=3,
                )
        return out

    def _record_exception(
        self,
        t: int,
        job: StepJob,
        direct: bool,
        health: dict[str, Any],
        t0: float,
        copied: CopyStats,
        e: BaseException,
    ) -> None:
        """The step raised ``e``: record it with its traceback and flush (the caller re-raises)."""
        health.update(raised=1.0, wall_time=time.perf_counter() - t0, time=time.time())
        exception = StepException(
            type=type(e).__name__,
            module=type(e).__module__,
            message=str(e),
            traceback="".join(traceback.format_exception(type(e), e, e.__traceback__)),
        )
        self.next_step = t + 1
        try:
            # (its health, and every step's still in flight, waited for: the step is failing)
            self._inflight.launch(t, job, direct, health, copied, exception)
            self._pass_on(self._inflight.drain())
            self._check_writer()
        except Exception as rec_error:  # noqa: BLE001 - the user's exception is the one to raise
            self._give_up("recording the exception", rec_error)

    def _finish(
        self,
        t: int,
        job: StepJob,
        direct: bool,
        health: dict[str, Any],
        ret: Any,
        t0: float,
        scale: Any,
        copied: CopyStats,
    ) -> Any:
        """After the step returned ``ret``: its health, launched to the host (``inflight.py``);
        the steps whose health is there are passed on, and the non-finite check reads them."""
        local_gn = None
        loss = None
        settled: list[Settled] = []
        try:
            wall = time.perf_counter() - t0
            # Before anything else: the norm when no clip or optimizer step measured it (an AMP
            # skip, accumulation, a loop without an optimizer).
            gn, gmax, stepped = self._probe_grads.end()
            loss = loss_of(ret)
            health["wall_time"] = wall
            health["time"] = time.time()
            health["loss"] = loss
            health["optimizer_stepped"] = float(stepped)
            health["grad_norm"] = gn
            health["grad_absmax"] = gmax  # not a column: decides grad_nonfinite exactly
            params_too = self.config.is_fingerprint_step(t) or _looks_bad(loss, gn)
            if self._watch:
                self._watch.end()
                params_too = params_too or self._watch.any_bad()
            if params_too:
                fp = param_fingerprint(self._params)
                health["param_fingerprint"] = fp
                health["param_absmax"] = exact_if_needed(fp, lambda: absmax(self._params))
            if self._watch:
                self._watch.into(health, params_too)
            local_gn = self._ranks.local_grad_norm()
            if local_gn is not None:
                health["local_grad_norm"] = local_gn
            if self.scaler is not None:
                after = getattr(self.scaler, "_scale", None)
                if scale is None and after is not None:
                    # GradScaler creates its scale tensor lazily, at the first scale() call: the
                    # first step ran with init_scale. Recording NaN here hid a skip of step 0, which
                    # then read as a non-finite failure (first_bad) instead of a normal AMP skip.
                    health["scale"] = float(getattr(self.scaler, "_init_scale", math.nan))
                health["scale_after"] = after.detach().clone() if after is not None else None
            if self._cuda_built and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # torch stubs
                health["cuda_allocated"] = float(torch.cuda.memory_allocated())
                health["cuda_peak"] = float(torch.cuda.max_memory_allocated())
            self._inflight.launch(t, job, direct, health, copied)
            # A step in the step log is in host memory (its copy is done at once): settled now,
            # before the log begins the next one. A GPU step is settled when its copy is done.
            settled = self._inflight.ready()
            if direct and self._inflight:
                settled += self._inflight.drain()  # (never waits: see above)
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self._give_up("recording the step's health", e)
            self.next_step = t + 1
            # (the other ranks still wait for this one's vote)
            self._ranks.after_step(t, loss, local_gn)
            return ret
        self.next_step = t + 1
        if self._self_check is not None:
            self._self_check.after_step(t)  # starts a child once; never waits
        self._pass_on(settled)
        if t == self.config.start_step:
            # Once, at the first step: wait until the file exists and holds what was passed on
            # (the writer process starting up, about 0.3 s), so a crash right after still leaves
            # a file. A step still in flight is not waited for.
            self.transport.flush()
            self._check_writer()
        if self._ranks.agrees:
            self._ranks.after_step(t, loss, local_gn)
        self._raise_if_bad()
        return ret

    def _end_preflight(self) -> None:
        """``replay preflight`` asked for this many steps: close the file and end the run."""
        self.close()
        print(
            f"replay preflight: recorded {self.preflight.steps} steps to {self.path}; "  # type: ignore[union-attr]
            "ending the run",
            file=sys.stderr,
            flush=True,
        )
        raise PreflightStop()

    def _give_up(self, what: str, e: Exception) -> None:
        """Recording fails on the training thread: stop it, say so once, keep training."""
        self.enabled = False
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"replay: recording to {self.path} stopped ({what} failed: "
                f"{type(e).__name__}: {e}); training goes on, and the steps flushed before "
                "stay readable",
                RecorderWarning,
                stacklevel=3,
            )

    def _unrecorded_step(self, batch: Any, values: dict[str, Any]) -> Any:
        """Recording stopped (write failure): train on, but still join the ranks' agreement,
        or the other ranks would wait for this one forever."""
        assert self._call is not None  # (step() saw to it)
        ret = self._call(batch, values)
        if self._ranks.agrees:
            self._ranks.after_step(self.next_step, loss_of(ret), self._ranks.local_grad_norm())
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

    def _raise_nonfinite(self, t: int, loss: float) -> None:
        self.flush()
        raise NonFiniteLossError(t, loss, self.path)

    def _settle_ready(self) -> None:
        """Before a step: the steps whose health copies are done are passed on, and checked
        (a GPU step's loss is so read a step late, or later: never waited for)."""
        self._raise_if_bad()  # (one a flush settled)
        settled = self._inflight.ready()
        if settled:
            self._pass_on(settled)
            self._raise_if_bad()

    def _pass_on(self, settled: list[Settled]) -> None:
        """Steps whose health reached the host: to the step log or the writer thread. The first
        non-finite loss among them is kept for :meth:`_raise_if_bad` (nothing raises here)."""
        try:
            for s in settled:
                if s.exception is None:
                    self.transport.finish(s.job, s.direct, s.health, s.copied)
                else:
                    self.transport.raised(s.job, s.direct, s.exception, s.copied)
        except Exception as e:  # noqa: BLE001 - the recorder must never take training down
            self._give_up("recording the step's health", e)
        if (
            self._bad_unraised is None
            and self.config.raise_on_nonfinite
            and not self._ranks.agrees  # (the ranks agree on their stop through their votes)
        ):
            for s in settled:
                if s.exception is None and s.loss is not None and not math.isfinite(s.loss):
                    self._bad_unraised = (s.step, s.loss)
                    break

    def _raise_if_bad(self) -> None:
        """Raise :class:`NonFiniteLossError` for the first settled step whose loss is NaN/Inf:
        in that step on the CPU, a step or more late on a GPU (when its copy is done)."""
        bad, self._bad_unraised = self._bad_unraised, None
        if bad is not None:
            self._raise_nonfinite(*bad)

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
        if self._key is None:
            return meta
        try:
            blob = json.loads(json.dumps(meta.to_json()))
            payload = signed_payload(
                blob, json.loads(json.dumps(sources)), self.run_id, FORMAT_VERSION
            )
            return dataclasses.replace(meta, signature=sign(payload, self._key))
        except (TypeError, ValueError):  # a value JSON cannot hold: the file is refused anyway
            return meta

    def _make_store(self, client: WriterClient) -> WriterClient:
        """Runs on the writer thread at the first commit, when sizes are known: the file,
        created through ``client`` with the run's metadata and sources."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        model_bytes = self._model_meta.param_bytes
        plan = self._snapshots.plan()
        meta = RunMeta(
            config=self.config.meta(plan),
            entry=self.entry,
            env=collect_env(),
            model=self._model_meta,
            optimizer=type(self.optimizer).__name__ if self.optimizer else None,
            objects=self.objects.describe(),
            scheduler=type(self.scheduler).__name__ if self.scheduler else None,
            scaler=type(self.scaler).__name__ if self.scaler else None,
            distributed=None
            if self.dist is None
            else {**self.dist.meta(), **({"fsdp": self._fsdp} if self._fsdp else {})},
            build_kwargs=self.build_kwargs or None,
            not_replayable=self.not_replayable,
            program=self.program,
            reach=plan.meta(),
        )
        sources = {}
        paths = [e["path"] for e in self.entry.values()]
        if self.program is not None:
            paths.append(self.program["path"])
        for path in paths:
            text = read_source(path) if path else None
            if text is not None:
                sources[path] = text
        meta = self._signed(meta, sources)
        # A step's record: the batch (sized at the first step, when the loop handed one over)
        # and about 16 KiB of RNG states and manifest. Chunks of about a quarter of it: each
        # chunk is one write call in the writer process (a 146 KB step in 16 KiB chunks cost 33
        # us there, in 64 KiB chunks 16 us), and a slot wastes at most one chunk's padding.
        step_guess = self._snapshots.step_guess()
        snap_guess = 4 * model_bytes + 4096  # weights, Adam's two moments, pending gradients
        return client.create(
            self.path,
            run_id=self.run_id,
            meta=meta,
            sources=sources,
            steps=RingSpec(plan.step_slots, pow2(step_guess // 4, 16 << 10, 1 << 20), step_guess),
            snapshots=RingSpec(plan.snapshot_slots, pow2(snap_guess, 4096, 1 << 20), snap_guess),
            health_slots=self.config.health_slots(plan.step_slots),
            watched=self._watch.names,
        )

    def flush(self, timeout: float | None = 60.0) -> None:
        """Wait until every recorded step is on disk (a step whose health is still on its way
        from the device waited for too; a non-finite loss among them raises at the next step)."""
        if self.transport is not None:
            self._pass_on(self._inflight.drain())
            self.transport.flush(timeout)
            self._check_writer()

    def _check_writer(self) -> None:
        """Before every step: what the writer reports (a wait, once; a failure, which stops
        recording), said as one :class:`RecorderWarning` each."""
        found = self.transport.check(self.next_step)
        if found is None:
            return
        if found.wait is not None:
            warnings.warn(found.wait, RecorderWarning, stacklevel=3)
        if found.stopped is not None:
            self.enabled = False
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"replay: recording to {self.path} stopped ({found.stopped}); {found.after}",
                    RecorderWarning,
                    stacklevel=3,
                )

    def close(self) -> None:
        """Flush and close the file. Idempotent; called on exit, SIGTERM and interpreter exit."""
        active.closed(self)
        if self._pending is not None or self._closed:
            return
        self._closed = True
        try:
            if self._refs is not None:
                self._refs.close()
            self._probe_grads.close()
            self._watch.close()
            self._ranks.close()
        finally:
            try:
                if self.transport is not None:
                    self._pass_on(self._inflight.drain())
                    self.transport.close()
                    self._check_writer()
            finally:
                self._lifecycle.end()

    def _close_again(self) -> None:
        if self.transport is not None:
            self.transport.close_again()

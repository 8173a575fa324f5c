"""The replay engine: rebuild the objects, restore a snapshot, re-run recorded steps exactly.

Two calls are the whole contract (the bisector and the tracer use nothing else to drive torch)::

    eng = Engine(open_recording("run.h5"))
    eng.state_before(t)          # live objects hold the state right before step t, its RNG,
                                 # hyper-parameters and module modes are in place
    out = eng.run_step(t)        # run the user's own step_fn on step t's recorded batch
    out = eng.run_step(t, batch=sliced)   # ... or on another batch (the state is then "dirty")

Replay is verified, never assumed: ``StepOutcome`` carries the loss, gradient norm and parameter
fingerprint computed with the recorder's own functions, for a bitwise comparison with the
recorded health row.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ..capture.bounded import is_unrecorded
from ..capture.environ import differs_here
from ..capture.fingerprint import absmax, exact_if_needed, loss_of, param_fingerprint
from ..capture.guard import LiveProgram, replay_runs_user_code
from ..capture.hparams import put_back
from ..capture.loader import check_drawn, draw, kept_rng
from ..capture.numerics import apply_numerics, current_env, differences
from ..capture.objects import RunObjects, StepCall, apply_layout, run_params
from ..capture.probe import GradProbe
from ..capture.remake import code_of, remake
from ..capture.rng import restore_rng
from ..capture.sharded import rebind_optimizer
from ..capture.tensors import from_leaves, leaf_finite
from ..capture.watch import ObjectWatch
from ..errors import RecordingError, ReplayError, first_line
from ..safetext import say
from ..store.liveness import writer_state
from ..store.reader import Recording, Window
from ..store.tree import TensorLeaf, leaves, map_tree
from .classes import OwnClasses
from .device import choose_device
from .entry import EntryOverride, load_entry_points, recorded_process
from .foreign import check_trusted
from .live import pin_live_window
from .observe import ObservedCalls
from .outcome import StepOutcome
from .state import build_objects, capture_state, load_snapshot, restore_state

__all__ = ["Engine"]


_CHECKPOINTS = 2  # in-memory states kept (the culprit's, and one spare): bounded memory
_RECORDS = 4  # step records cached (a re-run of the culprit reads its record again)
_LOOK_BACK = 2048  # step records read back (manifests) for a change of step function


def _num(x: Any) -> float | None:
    """A scalar as float64, exactly as the recorder's writer converts health values."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return float(x.detach().to("cpu", torch.float64).reshape(-1)[0]) if x.numel() else None
    return float(x)


def _own(x: Any) -> Any:
    """``x`` copied if it is a CPU tensor or array (``map_tree(_own, batch)``, object batches too).
    On the CPU, tensors rebuilt from a record share memory with the record the engine caches
    (torch.from_numpy): a step that changes its batch in place (``x.mul_(0.5)``) changed the
    cache, and the next replay of that step (bisect's re-check, a whatif experiment) ran on the
    changed batch. Tensors moved to another device are copies already."""
    if isinstance(x, torch.Tensor) and x.device.type == "cpu":
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x.copy() if isinstance(x, np.ndarray) else x


def _first_device(tree: Any) -> str:
    """Where the first tensor of a snapshot's part lived (``cpu`` when it holds none)."""
    return next((x.device for _, x in leaves(tree) if isinstance(x, TensorLeaf)), "cpu")


@contextlib.contextmanager
def _restoring(what: str) -> Iterator[None]:
    """Restoring recorded state must fail as one ``ReplayError`` (exit 5) that says what was
    being restored, never a traceback: a damaged record (an invalid mt19937 state read back as
    zeros) is reported, not replayed."""
    try:
        yield
    except ReplayError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure restoring state: one line, exit 5
        first = first_line(e)[:300]
        raise ReplayError(
            f"restoring {what} failed ({type(e).__name__}: {first}); the recording may be "
            "damaged: run `replay info` on it"
        ) from None


class Engine(ObservedCalls):
    """Replays steps of a recording: on the objects the re-run program handed over
    (``program``, replay/engine/reentry.py), or on those the recorded ``build_fn`` makes.

    ``device``: where to replay (default: where it was recorded when possible, else the CPU with
    a warning). ``entry``: an :class:`EntryOverride` (``--entry``). ``trust``: import the entry
    points of a recording this user did not sign or trust (``--trust``, docs/trust.md). ``log``:
    where notes go (stderr by default; never ``warnings``, which tests turn into errors).
    """

    def __init__(
        self,
        rec: Recording,
        *,
        device: str | None = None,
        entry: EntryOverride | None = None,
        log: Callable[[str], None] = say,
        trust: bool = False,
        program: LiveProgram | None = None,
    ) -> None:
        self.rec = rec
        self.log = log
        self.check_replayable(rec, live_ok=True)
        # A recording still being written: its window's records, read now (see live.py).
        self.live = pin_live_window(rec, rec.replayable_window(), log)
        window = self.check_replayable(rec, self.live.window if self.live is not None else None)
        assert window is not None  # (check_replayable raised otherwise)
        self.window = window
        env = rec.env
        self.recorded_device = (
            rec.snapshot_devices(window.first).get("model", "cpu")
            if self.live is None
            else _first_device(self.live.snapshots[window.first].get("model"))
        )
        self.device = choose_device(self.recorded_device, device, log)
        # Leaves go back where they were recorded unless we replay elsewhere.
        self._leaf_device = None if self.device == self.recorded_device else self.device
        self._configure_torch(env)
        self.objs: RunObjects
        # Recorder(loader=...): batches recorded by reference are drawn again from it.
        self.loader = program.loader if program is not None else None
        if program is not None:
            # Re-entry: the re-run program handed its own objects over (replay/engine/reentry.py).
            self.objs = program.objects
            self.objs.model.to(self.device)
            step_fn, files = program.step_fn, [str(rec.program["path"])] if rec.program else []
        else:
            check_trusted(rec, entry, trust)
            # The user's file is imported and build_fn called as in the recorded process: its
            # sys.argv (argparse at import time) and working directory (relative paths).
            with recorded_process(env, log):
                with replay_runs_user_code("importing the recorded entry points"):
                    eps = load_entry_points(rec.entry, rec.sources, entry, log)
                with replay_runs_user_code(
                    f"build_fn {getattr(eps.build_fn, '__qualname__', '')}()"
                ):
                    kwargs = {**(rec.meta.get("build_kwargs") or {}), **eps.build_args}
                    self.objs = build_objects(
                        eps.build_fn, self.device, rec.meta.get("objects"), kwargs
                    )
            step_fn, files = eps.step_fn, eps.files
        self.entry_files = files
        # Object batches are made as their own class only if it is one of these files' (classes.py).
        self._classes = OwnClasses(files, log)
        self.step_fn = step_fn
        self.call = StepCall(step_fn, self.objs)
        # where the run handed its step another function (format.md: step_fn): the latest
        # such step at or before each step, and the call made again for it (_call_at)
        self._changes: dict[int, int | None] = {}
        self._made: tuple[int | None, StepCall] = (None, self.call)
        self._modules = [m for _, m in self.objs.model.named_modules()]
        self._run_params = run_params(self.objs, self.objs.model)
        recorded_modules = rec.run_meta.model.modules
        if "modules" in (rec.meta.get("model") or {}) and len(recorded_modules) != len(
            self._modules
        ):
            who = "the program" if program is not None else "build_fn"
            raise ReplayError(
                f"{who} made a model with {len(self._modules)} modules, the recording has "
                f"{len(recorded_modules)}: the model changed since the recording"
            )
        self._params = list(self.objs.model.parameters())
        self._opt_params = self.objs.trained_params()
        # Same place, same function as the recorder: before any clip, before the update.
        self._probe = GradProbe(self._opt_params, self.objs.optimizer)
        # The run's other models and optimizers, measured as the recorder measured them.
        self._watch = ObjectWatch(self.objs)
        self._pos: int | None = None  # the live objects hold the state before this step
        self._checkpoints: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._records: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._snap: tuple[int, dict[str, Any]] | None = None
        self._init_observers()  # (observe.py: who sees the calls that may run steps)
        # steps whose recorded rows no replay is compared with (a rank's steps where a peer's
        # failure broke the collective: the recording holds that failure, not the step's own)
        self.not_compared: set[int] = set()
        self._tweak: Callable[[int], None] | None = None  # see off_record
        self._off_record = False
        self.wrapper: torch.nn.Module | None = None  # see use_wrapper
        # A context around step t's step function (a multi-rank replay: DDP's no_sync() at a
        # step whose all-reduce a peer never joined in the recording).
        self.around_step: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None
        if program is not None and program.wrapper is not None:
            self.use_wrapper(program.wrapper)  # the step runs through the program's wrapper

    @staticmethod
    def check_replayable(
        rec: Recording, window: Window | None = None, *, live_ok: bool = False
    ) -> Window | None:
        """The recording's replayable window (``window`` when given: a live file's, read at
        open); a ``RecordingError`` (exit 3) when it has none. ``live_ok``: a file still being
        written is not judged by a glance at its moving rings (``None``; see live.py)."""
        why = rec.run_meta.not_replayable
        if why is not None:
            first = rec.first_failure()
            shows = (
                f"the first failure in its health is at step {first}"
                if first is not None
                else "its health shows no failure"
            )
            raise RecordingError(
                f"{rec.path}: recorded without replay ({why}); {shows}, and replay info, "
                "doctor and tui read it"
            )
        if window is None and live_ok:
            state = writer_state(rec.file)
            if state is not None and not state.draining:
                return None
        window = window if window is not None else rec.replayable_window()
        if window is None:
            raise RecordingError(
                f"{rec.path}: nothing can be replayed (no kept snapshot with the batches after "
                "it); record with a smaller snapshot_every or a larger keep_snapshots"
            )
        return window

    def _around(self, t: int) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if self.around_step is None else self.around_step(t)

    def use_wrapper(self, wrapper: torch.nn.Module) -> None:
        """Hand ``step_fn`` ``wrapper`` (a ``DistributedDataParallel`` around :attr:`model`) as
        its model, as the recorded loop did; snapshots, modes and fingerprints stay on the plain
        module ``build_fn`` made (what the recorder kept)."""
        self.wrapper = wrapper
        self.call = self.call.with_objects(model=wrapper)
        self._made = (None, self.call)

    def shard_model(self, shard: Callable[[torch.nn.Module], None]) -> None:
        """Shard :attr:`model` in place with ``shard`` (FSDP2's ``fully_shard``, as the recorded
        loop did; ``replay.capture.sharded.shard_like``), before any step or snapshot.

        ``fully_shard`` replaces the parameters with DTensor ones: the optimizer ``build_fn``
        made is pointed at them by name, and the fingerprint and gradient probe measure them.
        """
        model = self.objs.model
        before = dict(model.named_parameters())
        shard(model)
        if self.objs.optimizer is not None:
            rebind_optimizer(self.objs.optimizer, before, model)
        self._params = list(model.parameters())
        self._opt_params = self.objs.trained_params()
        self._probe.close()
        self._probe = GradProbe(self._opt_params, self.objs.optimizer)
        self._pos = None
        self._checkpoints.clear()

    # -- the objects (for the tracer) ------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        return self.objs.model

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        opt: torch.optim.Optimizer | None = self.objs.optimizer
        return opt

    @property
    def scaler(self) -> Any:
        return self.objs.scaler

    def close(self) -> None:
        self._probe.close()
        self._watch.close()

    # -- set-up ------------------------------------------------------------------------------

    def _configure_torch(self, env: dict[str, Any]) -> None:
        # A different thread count changes CPU reduction order, and with it the last bits.
        n = env.get("num_threads")
        if n:
            torch.set_num_threads(int(n))
        if self.device.startswith("cuda"):
            torch.backends.cudnn.deterministic = bool(env.get("cudnn_deterministic", False))
            torch.backends.cudnn.benchmark = bool(env.get("cudnn_benchmark", False))
            torch.backends.cuda.matmul.allow_tf32 = bool(env.get("matmul_tf32", False))
        apply_numerics(env, self.device.startswith("cuda"))
        if env.get("deterministic_algorithms"):
            torch.use_deterministic_algorithms(
                True, warn_only=bool(env.get("deterministic_warn_only", False))
            )
        #: what this replay runs with that the recording did not (versions, GPUs, settings
        #: that could not be applied): a last-bit difference may be numerics, not state
        self.numerics_differences = differences(env, current_env(self.device.startswith("cuda")))
        if self.numerics_differences:
            self.log(f"replay: numerics differ: {'; '.join(self.numerics_differences)}")
        #: the environment variables this replay runs without, or with other values: a
        #: program that reads one into its step replays otherwise (``capture/environ.py``)
        self.environ_differences = differs_here(env.get("environ"))
        if self.environ_differences:
            self.log(
                "replay: the environment differs from the recording's: "
                + ", ".join(self.environ_differences)
            )

    # -- records -------------------------------------------------------------------------------

    def record(self, t: int) -> dict[str, Any]:
        """The recorded record of step ``t`` (RNG, hyper-parameters, modes, batch, exception)."""
        if self.live is not None and t in self.live.steps:
            return self.live.steps[t]
        if t in self._records:
            self._records.move_to_end(t)
            return self._records[t]
        try:
            r = self.rec.read_step(t)
        except KeyError as e:  # a live recording's ring moved on: the file, not the replay
            raise RecordingError(f"step {t} is no longer in the recording ({e})") from None
        self._records[t] = r
        while len(self._records) > _RECORDS:
            self._records.popitem(last=False)
        return r

    def batch(self, t: int) -> Any:
        """Step ``t``'s recorded batch as tensors on the replay device, the caller's own."""
        r = self.record(t)
        ref = r.get("batch_ref")
        if ref is not None:
            return self._drawn(t, ref)
        return map_tree(_own, from_leaves(r["batch"], self._leaf_device, self._classes))

    def batch_indices(self, t: int) -> list[int] | None:
        """The dataset indices of step ``t``'s samples, one per row of a batch recorded by
        reference (``Recorder(loader=...)``); ``None`` for a batch kept by value."""
        ref = self.record(t).get("batch_ref")
        if not isinstance(ref, dict) or not ref.get("batched"):
            return None
        idx = np.asarray(ref.get("indices"))
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            return None
        return [int(i) for i in idx]

    def _drawn(self, t: int, ref: dict[str, Any]) -> Any:
        """A batch recorded by reference, drawn again from the program's dataset and checked
        against its digest (capture/loader.py); a batch that differs is refused."""
        if self.loader is None:
            raise ReplayError(
                f"step {t}: its batch was recorded by reference (the sample indices of the "
                "program's DataLoader), and this replay has no loader: replay by running the "
                "program again (without --entry)"
            )
        with kept_rng():
            batch = draw(self.loader.dataset, self.loader.collate_fn, ref)
        check_drawn(batch, ref, t)
        if self._leaf_device is None:
            return batch
        dev = self._leaf_device
        return map_tree(lambda x: x.to(dev) if isinstance(x, torch.Tensor) else x, batch)

    def values(self, t: int) -> dict[str, Any]:
        """The per-step values the loop passed to ``rec.step(batch, **values)`` at step ``t``."""
        v = self.record(t).get("values")
        values: dict[str, Any] = (
            map_tree(_own, from_leaves(v, self._leaf_device, self._classes)) if v else {}
        )
        for name, value in values.items():
            why = is_unrecorded(value)
            if why is not None and self._call_at(t).takes(name):
                raise ReplayError(
                    f"step {t}: the per-step value {name!r} the step function takes was not "
                    f"recorded ({why}, beyond replay.capture.bounded.VALUE_LIMITS): pass a "
                    "smaller value through rec.step, or compute it inside the step"
                )
        return values

    def step_callable(self, t: int, **override: Any) -> Callable[[Any, Any, Any], Any]:
        """``fn(model, optimizer, batch)`` running step ``t``'s step function with its recorded
        values (``override`` replaces some), for tools that drive the step themselves (the
        tracer, overfit). ``model`` may be the eager module inside a compiled one."""
        values = {**self.values(t), **override}
        wrapper = self.wrapper

        def run(model: Any, optimizer: Any, batch: Any) -> Any:
            if wrapper is not None and model is self.objs.model:
                model = wrapper  # (a multi-rank replay: the step gets the DDP wrapper)
            with self._calling("call", (int(t),)), self._around(t):
                call = self._call_at(t).with_objects(model=model, optimizer=optimizer)
                return call(batch, values)

        return run

    def recorded_exception(self, t: int) -> dict[str, Any] | None:
        return self.record(t).get("exception")

    def recorded_rows(self) -> list[dict[str, Any]]:
        """The recorded health, one dict per step (``step`` plus every health column), less
        the steps in ``not_compared``."""
        return [r for r in self.rec.health_rows() if r["step"] not in self.not_compared]

    def snapshot(self, s: int) -> dict[str, Any]:
        """The snapshot taken before step ``s``, as read from the store.

        The last one read is kept: bisect checks a snapshot's health and then loads the same
        one (about 0.2 s a read for a 22 MB snapshot).
        """
        if self.live is not None and s in self.live.snapshots:
            return self.live.snapshots[s]
        if self._snap is None or self._snap[0] != s:
            self._snap = None  # drop the old one before reading the next: bounded memory
            try:
                self._snap = (s, self.rec.read_snapshot(s))
            except KeyError as e:  # (a live recording's ring moved on)
                raise RecordingError(
                    f"the snapshot of step {s} is no longer in the recording ({e})"
                ) from None
        return self._snap[1]

    def snapshot_finite(self, s: int) -> bool:
        """Whether every floating tensor of the snapshot at ``s`` (model, optimizer, the other
        named objects: a GAN's generator) is finite."""
        snap = self.snapshot(s)
        return all(
            leaf_finite(x)
            for _, x in leaves([snap.get("model"), snap.get("optimizer"), snap.get("objects")])
            if isinstance(x, TensorLeaf) and x.dtype.startswith(("float", "bfloat", "complex"))
        )

    # -- state -------------------------------------------------------------------------------

    def _prepare(self, t: int) -> None:
        """Put step ``t``'s recorded RNG states, hyper-parameters and module modes in place."""
        r = self.record(t)
        with _restoring(f"step {t}'s RNG states"):
            restore_rng(r["rng"], cuda=self.device.startswith("cuda"))
        with _restoring(f"step {t}'s hyper-parameters and module modes"):
            self._put_hparams_and_modes(t, r)
        if self._tweak is not None:
            self._tweak(t)

    def _put_hparams_and_modes(self, t: int, r: dict[str, Any]) -> None:
        opt = self.objs.optimizer
        groups = opt.param_groups if opt is not None else []
        hparams = r.get("hparams") or []
        if len(hparams) != len(groups) and opt is not None:
            self._relayout(t, len(hparams))
            groups = opt.param_groups
        if len(hparams) != len(groups):
            raise ReplayError(
                f"step {t}: the recording has {len(hparams)} param groups, the replayed "
                f"optimizer has {len(groups)}, and no snapshot says which parameters the "
                "others hold (the training loop changed the optimizer's groups between steps)"
            )
        for g, h in zip(groups, hparams):
            # Every recorded entry: a scheduler stepped outside step_fn changed lr, momentum...
            for k, v in h.items():
                g[k] = from_leaves(v, self._leaf_device)
        put_back(self.objs, r.get("object_hparams"), lambda v: from_leaves(v, self._leaf_device))
        modes = r.get("modes")
        if modes is not None:
            for m, training in zip(self._modules, modes):
                m.training = bool(training)
        flags = r.get("trainable")  # (where the loop froze or unfroze parameters)
        if flags is not None and len(flags) == len(self._run_params):
            for p, on in zip(self._run_params, map(bool, flags.tolist())):
                if p.requires_grad != on:
                    p.requires_grad_(on)

    def _relayout(self, t: int, n_groups: int) -> None:
        """The training loop changed the optimizer's groups between the snapshot this replay
        started from and step ``t`` (``add_param_group``: gradual unfreezing). Take the groups,
        and which parameters are frozen, from the nearest kept snapshot whose optimizer has
        ``n_groups`` groups: the newest at or before ``t``, else the oldest after it. Only the
        layout: the values carried on stay."""
        before = sorted((s for s in self.window.snapshots if s <= t), reverse=True)
        after = sorted(s for s in self.window.snapshots if s > t)
        for s in (*before, *after):
            try:
                layout = self.snapshot(s).get("layout")
            except RecordingError:
                continue
            kept = layout.get("groups") if isinstance(layout, dict) else None
            groups = kept.get("optimizer") if isinstance(kept, dict) else None
            if isinstance(groups, list) and len(groups) == n_groups:
                apply_layout(self.objs, self.objs.model, layout)
                return

    def state_before(self, t: int, *, keep: bool = False, fresh: bool = False) -> None:
        """Make the live objects hold the state right before step ``t`` and prepare step ``t``.

        Starts from the nearest of: the live state, an in-memory checkpoint, the newest kept
        snapshot at or before ``t``; then replays the steps in between. ``keep`` remembers this
        state in memory, so coming back to it (a second replay, the tracer) costs no replay.
        ``fresh`` starts from that snapshot whatever else is nearer: the path a bisect of a
        later failure takes, which a replay carried on from an earlier step never tests.
        """
        if t not in self.window:
            raise ReplayError(self.window.outside(f"step {t}"))
        with self._calling("state_before", (int(t), bool(keep), bool(fresh))):
            self._state_before(t, keep, fresh)

    def _state_before(self, t: int, keep: bool, fresh: bool) -> None:
        if self._pos != t or fresh:
            start, source = self.window.snapshot_for(t), "snapshot"
            ck = [c for c in self._checkpoints if start <= c <= t]
            if ck and not fresh:
                start, source = max(ck), "checkpoint"
            if self._pos is not None and start <= self._pos <= t and not fresh:
                start, source = self._pos, "live"
            if source == "snapshot":
                with _restoring(f"the snapshot of step {start}"):
                    load_snapshot(self.objs, self.snapshot(start), self._leaf_device)
            elif source == "checkpoint":
                restore_state(self.objs, self._checkpoints[start])
            self._pos = start
            for i in range(start, t):
                self.run_step(i)
        if keep and t not in self._checkpoints:
            spare = None
            while len(self._checkpoints) >= _CHECKPOINTS:
                _, spare = self._checkpoints.popitem(last=False)
            self._checkpoints[t] = capture_state(self.objs, reuse=spare)
        self._prepare(t)

    def replay_through(self, s: int) -> None:
        """From the live state, replay every step up to ``s`` (exclusive), never loading the
        snapshot of ``s``: the state then holds what replaying produced, for comparison with
        that snapshot."""
        if self._pos is None or self._pos > s:
            raise ReplayError(f"no live replayed state before step {s} to continue from")
        with self._calling("replay_through", (int(s),)):
            for i in range(self._pos, s):
                self.run_step(i)
            self._prepare(s)

    @contextlib.contextmanager
    def off_record(self, tweak: Callable[[int], None] | None = None) -> Iterator[None]:
        """Run steps on a state no recording holds (``replay whatif``'s experiments).

        Inside, ``run_step(t)`` runs on the live state whatever it is (a skipped step, a step
        run on another batch or with other hyper-parameters before it), and ``tweak(t)`` is
        called after step ``t``'s recorded RNG states, hyper-parameters and modes are put in
        place, to change them. On exit the live state is forgotten: the next ``state_before``
        restores from a checkpoint or a snapshot. NB: not reentrant.
        """
        self._tweak, self._off_record = tweak, True
        try:
            yield
        finally:
            self._tweak, self._off_record = None, False
            self.invalidate()

    def invalidate(self) -> None:
        """Forget where the live objects are (after someone else ran a step on them, e.g. the
        tracer); the next ``state_before`` restores from a checkpoint or a snapshot."""
        with self._calling("invalidate", ()):
            self._pos = None

    # -- the step function of a step ---------------------------------------------------------

    def _call_at(self, t: int) -> StepCall:
        """How step ``t`` is called: with the program's first step function, or with the one
        the run changed to at or before ``t``, made again as its record says
        (``capture/remake.py``); where it cannot be, with the first (verify names the step
        whose function changed as why it differs)."""
        c = self._change_at(t)
        if c == self._made[0]:
            return self._made[1]
        call = self.call
        if c is not None:
            spec = self.record(c).get("step_fn") or {}
            how = spec.get("remake") if isinstance(spec, dict) else None
            fn = None
            if isinstance(how, dict):
                fn = remake(self.step_fn, from_leaves(how, self._leaf_device), self.objs.named)
            if fn is not None and code_of(fn) is code_of(self.step_fn):
                call = self.call.with_step(fn)
            elif fn is not None:
                call = StepCall(fn, self.objs)
                if self.wrapper is not None:
                    call = call.with_objects(model=self.wrapper)
        self._made = (c, call)
        return call

    def unmade_step_fn(self, t: int) -> tuple[int, dict[str, Any]] | None:
        """``(c, its record's step_fn)`` when step ``t`` runs with the program's first step
        function though the run changed it at step ``c <= t`` and it could not be made again
        (why.py names it as the cause); ``None`` otherwise. A snapshot step repeating the
        change names the step it was made at (``since``)."""
        c = self._change_at(t)
        if c is None or self._call_at(t) is not self.call:
            return None
        fn = self.rec.read_step_entries(c, ("step_fn",)).get("step_fn")
        if not isinstance(fn, dict):
            return None
        since = fn.get("since")
        return (since if isinstance(since, int) else c), fn

    def _change_at(self, t: int) -> int | None:
        """The latest step at or before ``t`` whose record says the run handed it another step
        function (``None``: none, the first's), reading back at most ``_LOOK_BACK`` steps."""
        if t in self._changes:
            return self._changes[t]
        if isinstance(self.record(t).get("step_fn"), dict):
            c: int | None = t
        elif t - 1 in self._changes:
            c = self._changes[t - 1]
        else:
            c = None
            for s in range(t - 1, max(self.window.first, t - _LOOK_BACK) - 1, -1):
                try:
                    found = self.rec.read_step_entries(s, ("step_fn",)).get("step_fn")
                except (KeyError, RecordingError):
                    break
                if isinstance(found, dict):
                    c = s
                    break
        self._changes[t] = c
        return c

    # -- a step ------------------------------------------------------------------------------

    def run_step(self, t: int, batch: Any = None) -> StepOutcome:
        """Run step ``t`` (on its recorded batch, or on ``batch``) and measure it like the recorder.

        Exceptions raised by ``step_fn`` are caught and returned in ``StepOutcome.exception``.
        """
        with self._calling("run_step", (int(t), batch is None)):
            out = self._run_step(t, batch)
        self._ran(int(t), batch is None, out)
        return out

    def _run_step(self, t: int, batch: Any) -> StepOutcome:
        if self._pos != t and not self._off_record:
            self.state_before(t)
        self._prepare(t)
        b = self.batch(t) if batch is None else batch
        values = self.values(t)
        opt = self.objs.optimizer
        g0 = opt.param_groups[0] if opt is not None and opt.param_groups else values
        lr = g0.get("lr")
        out = StepOutcome(
            step=t, lr=_num(lr) if isinstance(lr, (int, float, torch.Tensor)) else None
        )
        scaler = self.objs.scaler
        if scaler is not None:
            out.scale = _num(getattr(scaler, "_scale", None))
        # Whatever happens below, the live state is no longer "before t"; a foreign batch
        # leaves a state no recorded step follows from.
        self._pos = t + 1 if batch is None else None
        self._probe.begin()
        self._watch.begin()
        try:
            with self._around(t):
                ret = self._call_at(t)(b, values)
        except Exception as e:  # noqa: BLE001 - the step's own failure is a result, not a replay failure
            self._probe.end(measure=False)
            self._watch.end(measure=False)
            out.watched = self._watch.names
            out.exception = {
                "type": type(e).__name__,
                "module": type(e).__module__,
                "message": str(e),
            }
            return out
        gn, gmax, stepped = self._probe.end()  # as the recorder: measured now if nothing did
        self._watch.end()
        out.watched = self._watch.names
        self._watch.into(out.objects, True)
        out.loss = _num(loss_of(ret))
        out.optimizer_stepped = float(stepped)
        out.grad_norm = _num(gn)
        out.grad_absmax = _num(gmax)
        fp = param_fingerprint(self._params)
        out.param_fingerprint = _num(fp)
        out.param_absmax = _num(exact_if_needed(fp, lambda: absmax(self._params)))
        if scaler is not None:
            after = _num(getattr(scaler, "_scale", None))
            out.scale_after = math.nan if after is None else after
            if out.scale is None and after is not None:
                # As the recorder: GradScaler makes its scale tensor lazily (a scaler fresh from
                # a snapshot has none), so the step ran with init_scale. Without this a skip in
                # the first step after a snapshot read as a non-finite failure.
                out.scale = _num(getattr(scaler, "_init_scale", None))
        return out

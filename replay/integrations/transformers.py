"""Record a Hugging Face ``Trainer.train()`` with one callback; replay it without a Trainer's loop.

Usage (the only change to a training script)::

    from replay.integrations.transformers import ReplayCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[ReplayCallback("run.h5")])

One recorded step is one optimisation step: the ``gradient_accumulation_steps`` micro-batches
of its window, each through the Trainer's own ``training_step`` (``compute_loss`` under the
accelerator's autocast, the loss normalised for accumulation as the Trainer does it, the
accelerator's backward), clipping to ``max_grad_norm`` by the accelerator, the optimizer step
and the learning-rate scheduler the Trainer stepped after it. Precision: fp32 and bf16 (the
accelerator's autocast, on a CPU too) replay bitwise on the CPU (tests/integrations). fp16 on a
CPU gets neither autocast nor a GradScaler from accelerate, so it trains, and replays, as fp32;
fp16 on a GPU adds the accelerator's GradScaler, which is recorded and restored like any
scaler, but no test covers it (the test machines have no GPU).

How: a ``TrainerCallback`` gets no batch and no Trainer, so at ``on_train_begin`` the callback
finds its Trainer (the caller of the callback handler) and wraps that instance's
``training_step``, which sees every micro-batch after collation. ``on_step_begin`` begins the
step (``Recorder.observe_begin``: snapshot, RNG states, hyper-parameters; the Trainer has
fetched the whole window by then, so no data loading draws from the RNG inside the step);
each ``training_step`` call adds a copy of its micro-batch; ``on_pre_optimizer_step`` measures
the gradients if the clip did not already (before clipping, as everywhere in replay);
``on_step_end`` records the window, its ``num_items_in_batch``, how often the scheduler stepped
and the summed micro-batch losses. Recorded step ``t`` is the one after which the Trainer's
``global_step`` is ``t + 1`` (a resumed run starts at its checkpoint's step). An exception
inside the epoch is recorded with the window it broke (through a wrapper of the instance's
``_run_epoch``, a private Trainer method: when a release renames it, exceptions are not
recorded, steps still are); a ``KeyboardInterrupt`` is not a step's result and is not.

On replay, ``replay`` runs the user's script again (docs/reentry.md): it makes its own model
(any ``nn.Module``), optimizer, scheduler and Trainer, and at ``train()``'s ``on_train_begin``
the callback hands them to replay; :func:`train_step` runs each recorded window through that
Trainer's ``training_step``, ``_clip_grad_norm``, optimizer and scheduler, and ``train()`` ends
before its loop runs. Recordings made by earlier releases (with :func:`build`, which made the
model again from its config or ``model_init``) still replay. Bitwise equality with the recording
is checked by ``replay verify``, never assumed.

Not replayed (said once at the start; then each step's health, batch and RNG states are
recorded without snapshots, ``Recorder(not_replayable=...)``, which ``info``/``doctor``/``tui``
read and ``bisect`` refuses with the reason): more than one process (DDP), DataParallel over
several GPUs, a model the Trainer wrapped. DeepSpeed and FSDP shard the parameters (measuring
them would take collectives): nothing is recorded. Other callbacks that
change gradients, weights or the learning rate inside a step, and a ``ReduceLROnPlateau``
stepped at evaluation (its learning rate is restored from the recording at every step), make a
replay differ, which ``replay verify`` reports.
"""

from __future__ import annotations

import collections
import functools
import importlib
import inspect
import logging
import sys
import tempfile
import types
import warnings
from typing import Any

import torch
import transformers
from transformers import PreTrainedModel, TrainerCallback, TrainingArguments

from ..capture.objects import inner_optimizer
from ..errors import NonFiniteLossError, RecorderWarning
from ..store.tree import ObjectRecord, keep_kind
from ._recording import RecordingCallback, clone_batch, sched_count, total_loss

__all__ = ["ReplayCallback", "build", "train_step"]

# TrainingArguments that only say where the run writes and reports: a replay writes nothing.
_QUIET = {"report_to": "none", "disable_tqdm": True, "save_strategy": "no", "push_to_hub": False}


def _as_dict(node: Any, rec: ObjectRecord) -> Any:
    """A ``BatchEncoding`` (a ``UserDict``) as a plain dict: as its own class it would replay
    as a stand-in, not a mapping (``training_step`` takes either)."""
    return rec.attrs["data"] if isinstance(node, collections.UserDict) else keep_kind(node, rec)


def _find_trainer(callback: TrainerCallback) -> Any:
    """The Trainer whose callback handler calls ``callback`` now: a hook gets no Trainer, but
    the handler is called from a Trainer method a few frames up."""
    frame: types.FrameType | None = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        handler = getattr(owner, "callback_handler", None)
        if isinstance(owner, transformers.Trainer) and callback in getattr(
            handler, "callbacks", ()
        ):
            return owner
        frame = frame.f_back
    return None


def _why_not(trainer: Any) -> str | None:
    """Why a Trainer's steps cannot be replayed (DeepSpeed and FSDP record nothing at all)."""
    if getattr(trainer, "is_fsdp_xla_enabled", False):
        return "FSDP"
    nproc = int(getattr(trainer.accelerator, "num_processes", 1) or 1)
    if nproc > 1 or int(trainer.args.world_size) > 1:
        return (
            f"{max(nproc, int(trainer.args.world_size))} processes (only one process is replayed)"
        )
    if int(trainer.args.n_gpu) > 1:
        return f"DataParallel over {trainer.args.n_gpu} GPUs"
    if trainer.model_wrapped is not trainer.model:
        return f"the model wrapped in {type(trainer.model_wrapped).__name__}"
    return None


def _objects(trainer: Any) -> dict[str, Any]:
    """The objects a recorded step touches, by the names recording and replay share."""
    objects: dict[str, Any] = {
        "model": trainer.model,
        "optimizer": inner_optimizer(trainer.optimizer),  # inside AcceleratedOptimizer
        "scheduler": trainer.lr_scheduler,
        "trainer": trainer,
    }
    if (scaler := getattr(trainer.accelerator, "scaler", None)) is not None:
        objects["scaler"] = scaler
    return objects


def _lookup(name: Any, base: type) -> Any:
    """A class :func:`_name` recorded: a ``transformers`` class by name (only there, and only
    a subclass of ``base``), or the user's class the engine imported."""
    if not isinstance(name, str):
        return name
    module, _, qualname = name.partition(":")
    if not (module == "transformers" or module.startswith("transformers.")):
        raise ValueError(f"{name!r} is not a transformers class")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ValueError(f"{name!r} is not a {base.__name__}")
    return obj


class ReplayCallback(RecordingCallback, TrainerCallback):
    """Record every optimisation step of ``Trainer.train()`` into ``path`` for ``replay bisect``.

    Example::

        args = TrainingArguments("out", gradient_accumulation_steps=2, max_grad_norm=1.0)
        trainer = Trainer(model=model, args=args, train_dataset=ds,
                          callbacks=[ReplayCallback("run.h5")])
        trainer.train()

    Any model, optimizer and scheduler the script gives the Trainer replay (the script runs
    again up to ``train()``). Recorded step ``t`` is the optimisation step after
    which the Trainer's ``global_step`` is ``t + 1`` (a resumed run starts at its global step). ``recorder_kwargs`` go to :class:`replay.Recorder`
    (``snapshot_every=50``, ``raise_on_nonfinite=True``, ...): a NaN loss is recorded and then
    :class:`replay.NonFiniteLossError` ends ``train()``.
    """

    def __init__(self, path: str, **recorder_kwargs: Any) -> None:
        super().__init__(path, **recorder_kwargs)
        self._trainer: Any = None
        self._num_items: Any = None
        self._sched_before = 0
        self._global_step = 0

    # -- set-up --------------------------------------------------------------------------

    def _refuse(self, why: str) -> None:
        warnings.warn(
            f"replay: {why} cannot be replayed; ReplayCallback records nothing of this run",
            RecorderWarning,
            stacklevel=3,
        )

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = _find_trainer(self)
        if trainer is None:
            self._refuse("a training loop that is not a transformers.Trainer's")
            return
        if getattr(trainer, "is_deepspeed_enabled", False) or getattr(
            trainer, "is_fsdp_enabled", False
        ):
            # Sharded parameters: measuring them (the gradient norm) would take collectives.
            self._refuse("DeepSpeed or FSDP (sharded parameters)")
            return
        # Steps numbered from global_step (the class docstring). Under replay this is where the
        # re-run script is taken over (docs/reentry.md): the Recorder hands the live model,
        # optimizer, scheduler and Trainer to replay, and train() ends before its loop runs.
        self._start(
            int(state.global_step),
            objects=_objects(trainer),
            step_fn=train_step,
            not_replayable=_why_not(trainer),
        )
        if self.rec is not None:
            self._trainer = trainer
            self._wrap(trainer)

    def _wrap(self, trainer: Any) -> None:
        """Instance attributes over the Trainer's methods (its class is left alone), removed
        when training ends."""
        step = trainer.training_step

        @functools.wraps(step)
        def training_step(model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            if self._window is not None:
                if not self._window:
                    self._num_items = clone_batch(num_items_in_batch)
                self._window.append(clone_batch(inputs, _as_dict))
            loss = step(model, inputs, num_items_in_batch)
            if self._window is not None:
                self._losses.append(loss)
            return loss

        trainer.training_step = training_step
        epoch = getattr(trainer, "_run_epoch", None)
        if epoch is None:
            return

        @functools.wraps(epoch)
        def run_epoch(*args: Any, **kwargs: Any) -> Any:
            try:
                return epoch(*args, **kwargs)
            except BaseException as e:
                self._raised(self._values(0), e)
                raise

        trainer._run_epoch = run_epoch

    # -- one optimisation step -------------------------------------------------------------

    def _values(self, sched_steps: int) -> dict[str, Any]:
        return {
            "num_items_in_batch": self._num_items,
            "sched_steps": sched_steps,
            "global_step": self._global_step,
        }

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rec is None or not self.rec.observe_begin():
            return
        self._window, self._losses, self._num_items = [], [], None
        self._global_step = int(state.global_step)
        self._sched_before = sched_count(self._trainer.lr_scheduler)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rec is not None:
            self.rec.measure_grads()  # when no clip measured them (max_grad_norm = 0)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rec is None or self._window is None:
            return
        window, self._window = self._window, None
        stepped = sched_count(self._trainer.lr_scheduler) - self._sched_before
        try:
            self.rec.observe_end(window, self._values(stepped), ret=total_loss(self._losses))
        except NonFiniteLossError:
            self._close()
            raise

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    def _close(self, ended_by: BaseException | None = None) -> None:
        trainer, self._trainer = self._trainer, None
        if trainer is not None:  # (what _wrap put over the Trainer's methods comes off)
            for name in ("training_step", "_run_epoch"):
                trainer.__dict__.pop(name, None)
        super()._close(ended_by)


# -- replay ---------------------------------------------------------------------------------


def build(
    args: dict[str, Any],
    max_steps: int,
    trainer_class: type | str,
    dtype: str,
    args_class: type | str = "transformers.training_args:TrainingArguments",
    model_class: type | str | None = None,
    config_class: type | str | None = None,
    config: dict[str, Any] | None = None,
    model_init: Any = None,
    compute_loss_func: Any = None,
) -> dict[str, Any]:
    """Rebuild the recorded model, a Trainer of the recorded class and ``TrainingArguments``
    (no loop runs; it writes and reports nothing) and the optimizer and scheduler it creates,
    prepared by its accelerator as ``train()`` does; the names are the ones the callback
    recorded."""
    if model_class is not None and config_class is not None:
        config_cls = _lookup(config_class, transformers.PretrainedConfig)
        model = _lookup(model_class, PreTrainedModel)(config_cls.from_dict(config or {}))
    elif model_init is not None:
        # As Trainer.call_model_init: with the trial when it takes one (none on replay).
        takes = len(inspect.signature(model_init).parameters)
        model = model_init(None) if takes == 1 else model_init()
    else:
        raise ValueError("the recording names neither a model class with its config nor model_init")
    model = model.to(getattr(torch, dtype))
    kw = {**args, **_QUIET, "output_dir": tempfile.gettempdir()}
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # notes about this idle Trainer are not the user's business
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            targs = _lookup(args_class, TrainingArguments)(**kw)
            extra = {"compute_loss_func": compute_loss_func} if compute_loss_func else {}
            trainer = _lookup(trainer_class, transformers.Trainer)(model=model, args=targs, **extra)
            trainer.state.max_steps = int(max_steps)
            trainer._prepare_for_training(int(max_steps), None, None)
    finally:
        quiet.setLevel(level)
    trainer.model.train()
    return _objects(trainer)


def train_step(
    trainer: Any,
    batch: list[Any],
    num_items_in_batch: Any,
    sched_steps: int,
    global_step: int,
) -> Any:
    """One recorded optimisation step, as ``Trainer._run_epoch`` runs it: each micro-batch
    through ``training_step`` (gradients synchronised at the last one), the clip, the
    optimizer step, the scheduler as often as it stepped when recording, ``zero_grad``."""
    model = trainer.model_wrapped
    acc = trainer.accelerator
    trainer.state.global_step = int(global_step)
    trainer.current_gradient_accumulation_steps = len(batch)
    losses = []
    for i, inputs in enumerate(batch):
        acc.gradient_state._set_sync_gradients(i == len(batch) - 1)
        losses.append(trainer.training_step(model, inputs, num_items_in_batch))
    grad_norm = trainer._clip_grad_norm(model) if trainer.args.max_grad_norm > 0 else None
    trainer._get_grad_norm(model, grad_norm=grad_norm)
    trainer.optimizer.step()
    for _ in range(int(sched_steps)):
        trainer.lr_scheduler.step()
    model.zero_grad()
    trainer.state.global_step = int(global_step) + 1
    return total_loss(losses)

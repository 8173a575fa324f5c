"""Record a PyTorch Lightning ``Trainer.fit()`` with one callback; replay it inside the user's own
script (re-entry), through Lightning's own optimisation code.

Usage (the only change to a training script; ``lightning.pytorch`` or ``pytorch_lightning``)::

    from replay.integrations.lightning import ReplayCallback
    trainer = L.Trainer(..., callbacks=[ReplayCallback("run.h5")])

One recorded step is one optimisation step: the ``accumulate_grad_batches`` micro-batches of
its window, each ``training_step`` with its loss normalised as Lightning does, zero_grad,
the precision plugin's autocast and loss scaling, the backward, gradient clipping with the
Trainer's settings, the optimizer step (with the GradScaler's unscale/step/update under
``16-mixed``) and the learning-rate schedulers Lightning stepped after it.

How: the callback *observes* Lightning's own step (``Recorder.observe_begin``/``observe_end``):
before the window, the snapshot, RNG states and hyper-parameters; per micro-batch, a copy of the
batch and the torch RNG state (data loading between micro-batches may draw from it); after the
step, the loss and which schedulers stepped. On replay, ``replay`` runs the user's script again
(docs/reentry.md): it builds its own module (no ``save_hyperparameters()`` needed) and Trainer,
and at ``fit()``'s ``on_train_start`` the callback hands the live module, Trainer, optimizers,
schedulers and scaler to replay; :func:`train_step` then runs each recorded window through
Lightning's own automatic-optimisation code (``_AutomaticOptimization.run``, the module's hooks,
the precision plugin), and ``fit()`` ends before its loop runs. Recordings made by earlier
releases (with :func:`build`, which makes the module from its ``save_hyperparameters()``
values) still replay. Bitwise equality with the recording is checked by ``replay verify``,
never assumed.

Not replayed (said once at the start): manual optimisation, several optimizers, strategies
other than a single device: the callback then records each
step's health, batch and RNG states without snapshots (``Recorder(not_replayable=...)``), which
``info``/``doctor``/``tui`` read and ``bisect`` refuses with the reason. FSDP and DeepSpeed
shard the parameters (measuring them would take collectives): nothing is recorded. Other callbacks that
change gradients or weights, ``ReduceLROnPlateau`` stepping (its learning rate is restored
from the recording at every step) and a ``training_step`` that reads ``self.trainer`` state
(``global_step`` is 0 on replay) make a replay differ, which ``replay verify`` reports.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections import OrderedDict
from typing import Any

import torch

try:  # the unified package, or the standalone one most tutorials import
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - only pytorch_lightning installed
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

from ..capture.guard import replaying
from ..capture.probe import running_probe
from ..errors import RecorderWarning
from ._recording import RecordingCallback, clone_batch, sched_count, total_loss

__all__ = ["ReplayCallback", "build", "train_step"]

_SINGLE = ("SingleDeviceStrategy",)


def _why_not(trainer: pl.Trainer, module: pl.LightningModule) -> str | None:
    if not module.automatic_optimization:
        return "manual optimisation (automatic_optimization = False)"
    name = type(trainer.strategy).__name__
    if name not in _SINGLE:
        return f"the {name} strategy (only a single device is replayed)"
    if len(trainer.optimizers) != 1:
        return f"{len(trainer.optimizers)} optimizers"
    return None


def _objects(module: pl.LightningModule, trainer: pl.Trainer) -> dict[str, Any]:
    """The objects a recorded step touches, by the names recording and replay share."""
    objects: dict[str, Any] = {"model": module, "trainer": trainer}
    for i, opt in enumerate(trainer.optimizers):
        objects["optimizer" if i == 0 else f"optimizer_{i}"] = opt
    for i, cfg in enumerate(trainer.lr_scheduler_configs):
        objects["scheduler" if i == 0 else f"scheduler_{i}"] = cfg.scheduler
    if (scaler := getattr(trainer.precision_plugin, "scaler", None)) is not None:
        objects["scaler"] = scaler
    return objects


class ReplayCallback(RecordingCallback, Callback):
    """Record every optimisation step of ``Trainer.fit()`` into ``path`` for ``replay bisect``.

    Example::

        trainer = L.Trainer(max_epochs=3, accumulate_grad_batches=2, gradient_clip_val=1.0,
                            callbacks=[ReplayCallback("run.h5")])
        trainer.fit(model, loader)

    Replay runs the script again and takes over in ``fit()`` (docs/reentry.md): the module needs
    no ``save_hyperparameters()``, and ``pytorch_lightning`` works as ``lightning.pytorch`` does.
    ``recorder_kwargs`` go to
    :class:`replay.Recorder` (``snapshot_every=50``, ``raise_on_nonfinite=True``, ...): a NaN loss
    is recorded and then :class:`replay.NonFiniteLossError` ends ``fit()``.
    """

    def __init__(self, path: str, **recorder_kwargs: Any) -> None:
        super().__init__(path, **recorder_kwargs)
        self._micro_rng: list[torch.Tensor] = []
        self._first_idx = 0
        self._epoch = 0
        self._sched_before: list[int] = []

    # -- set-up --------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Under replay, let LightningCLI's SaveConfigCallback write its config again: it
        refuses a ``config.yaml`` that exists, and the recorded run made that one. Its write
        goes to a private copy (the re-run guard), so the user's file stays as it is."""
        if not replaying():
            return
        for cb in trainer.callbacks:  # type: ignore[attr-defined]
            if type(cb).__name__ == "SaveConfigCallback" and hasattr(cb, "overwrite"):
                cb.overwrite = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        name = type(trainer.strategy).__name__
        if "FSDP" in name or "DeepSpeed" in name:  # parameters sharded across ranks
            warnings.warn(
                f"replay: the {name} strategy shards the parameters; ReplayCallback records "
                "nothing of this run (measuring them would take collectives)",
                RecorderWarning,
                stacklevel=2,
            )
            return
        # Under replay this is where the re-run script is taken over (the Recorder hands these
        # live objects to replay and ends fit()); the step is this module's train_step.
        # A run resumed with fit(ckpt_path=...) numbers its steps from the checkpoint's
        # global_step (12..23 after 12 steps), as the Hugging Face callback does.
        self._start(
            int(trainer.global_step),
            objects=_objects(pl_module, trainer),
            step_fn=train_step,
            not_replayable=_why_not(trainer, pl_module),
        )

    # -- one optimisation step -------------------------------------------------------------

    def _values(self, sched_steps: list[int]) -> dict[str, Any]:
        """The window's per-step values, as ``train_step`` takes them on replay."""
        return {
            "batch_idx": self._first_idx,
            "epoch": self._epoch,
            "micro_rng": self._micro_rng,
            "sched_steps": sched_steps,
        }

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.rec is None:
            return
        if self._window is None:
            if not self.rec.observe_begin():
                return
            self._window, self._micro_rng, self._losses = [], [], []
            self._first_idx, self._epoch = batch_idx, trainer.current_epoch
            self._sched_before = [sched_count(c.scheduler) for c in trainer.lr_scheduler_configs]
        self._window.append(clone_batch(batch))
        self._micro_rng.append(torch.get_rng_state())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if self.rec is not None:
            self.rec.measure_grads()
            return
        if (probe := running_probe()) is not None:  # replaying: where the recording measured
            probe.measure_now()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.rec is None or self._window is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._losses.append(loss)
        if trainer.fit_loop._should_accumulate():
            return  # the window goes on: Lightning steps the optimizer at its last micro-batch
        window, self._window = self._window, None
        stepped = [
            sched_count(c.scheduler) - b
            for c, b in zip(trainer.lr_scheduler_configs, self._sched_before)
        ]
        self.rec.observe_end(window, self._values(stepped), ret=total_loss(self._losses))

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._raised(self._values([0] * len(trainer.lr_scheduler_configs)), exception)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()


# -- replay ---------------------------------------------------------------------------------


class _MeasureGrads(Callback):
    """On replay, where the callback measured when recording: the gradients are complete."""

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if (probe := running_probe()) is not None:
            probe.measure_now()


def build(
    module: type,
    hparams: dict[str, Any],
    precision: str,
    device: str,
    accumulate_grad_batches: int,
    gradient_clip_val: Any,
    gradient_clip_algorithm: Any,
    schedulers: int,
) -> dict[str, Any]:
    """Rebuild the recorded module, a Trainer with the recorded settings (no loop runs) and the
    module's ``configure_optimizers``; the names are the ones the callback recorded. (The
    entry point of recordings made before re-entry; new ones replay the user's script.)"""
    from lightning.pytorch.plugins import MixedPrecision
    from lightning.pytorch.trainer.states import RunningStage, TrainerFn

    model = module(**hparams)
    quiet = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.WARNING)  # Lightning's notes about this idle trainer: not the user's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The recorded plugin as Lightning made it: a "16-mixed" flag alone becomes bf16 on a CPU.
        mixed = precision in ("16-mixed", "bf16-mixed")
        trainer = pl.Trainer(
            accelerator="gpu" if device == "cuda" else "cpu",
            devices=1,
            precision=None if mixed else precision,  # type: ignore[arg-type]
            plugins=[MixedPrecision(precision, device)] if mixed else None,  # type: ignore[arg-type]
            accumulate_grad_batches=accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            barebones=True,
            callbacks=[_MeasureGrads()],
        )
    for lg, level in zip(quiet, levels):
        lg.setLevel(level)
    trainer.strategy.connect(model)
    model.trainer = trainer
    trainer.state.fn = TrainerFn.FITTING
    trainer.state.stage = RunningStage.TRAINING
    trainer.strategy.setup(trainer)
    model.train()
    configs = trainer.lr_scheduler_configs
    if len(configs) != schedulers:
        raise ValueError(
            f"configure_optimizers made {len(configs)} schedulers, the recording has {schedulers}"
        )
    return _objects(model, trainer)


def train_step(
    trainer: Any,
    batch: list[Any],
    batch_idx: int,
    epoch: int,
    micro_rng: list[torch.Tensor],
    sched_steps: list[int],
) -> Any:
    """One recorded optimisation step through Lightning's own automatic-optimisation code."""
    if (probe := running_probe()) is not None:
        probe.measure_at_hooks()  # as when recording: at on_before_optimizer_step
    loop = trainer.fit_loop.epoch_loop
    loop.batch_progress.current.ready = int(batch_idx)
    trainer.fit_loop.epoch_progress.current.completed = int(epoch)
    losses = []
    n = len(batch)
    for i, (micro, rng) in enumerate(zip(batch, micro_rng)):
        idx = int(batch_idx) + i
        torch.set_rng_state(rng.cpu())
        loop.batch_progress.current.ready = idx + 1
        loop.batch_progress.is_last_batch = i == n - 1
        kwargs = loop._build_kwargs(OrderedDict(), micro, idx)
        with warnings.catch_warnings():
            # self.log() in training_step: nothing logs on replay, and Lightning says so.
            warnings.filterwarnings("ignore", message=".*self.log.*")
            out = loop.automatic_optimization.run(trainer.optimizers[0], idx, kwargs)
        if out.get("loss") is not None:
            losses.append(out["loss"])
    # through ``trainer.call`` of the package the user's Trainer is from (either namespace)
    root = type(trainer).__module__.split(".")[0]
    package = "pytorch_lightning" if root == "pytorch_lightning" else "lightning.pytorch"
    call = importlib.import_module(f"{package}.trainer.call")
    for cfg, times in zip(trainer.lr_scheduler_configs, sched_steps):
        for _ in range(int(times)):
            call._call_lightning_module_hook(trainer, "lr_scheduler_step", cfg.scheduler, None)
    return total_loss(losses)

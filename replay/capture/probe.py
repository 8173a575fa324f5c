"""Where a step's gradient norm is measured: before any clipping, before the update.

The recorder and the replay engine both measure through :class:`GradProbe`, so a recorded norm
and a replayed one come from the same place in the step. Once per step, at the first of:

* a gradient clip (``torch.nn.utils.clip_grad_norm_``, ``clip_grads_with_norm_``,
  ``clip_grad_value_``), right before it changes the gradients;
* the optimizer's step, in a step pre-hook (before the update);
* the end of the step, when neither happened (a GradScaler skip, accumulation, a loop that
  updates the parameters itself).

Under a GradScaler, an optimizer that unscales inside its own step (``fused=True`` Adam, AdamW,
SGD: ``_step_supports_amp_scaling``) is handed gradients that are still scaled, and the scale as
``optimizer.grad_scale`` for the step's length: the norm measured at its pre-hook is divided by
it, the norm the update sees (``scaler.step`` unscales the others' before their step).

Measuring after a clip recorded the clip value (or 0.0 when an infinite norm made the clip zero
the gradients), so an exploding gradient never showed in a clipped run.

``clip_grad_norm_`` looks ``_clip_grads_with_norm_`` up in its module at every call, so wrapping
that global catches it however the user imported ``clip_grad_norm_``. The public
``clip_grads_with_norm_`` and ``clip_grad_value_`` are wrapped where torch exports them; a
reference the user took before ``import replay`` is not seen (the norm is then taken at the
optimizer's step, after the clip). NB: one training step runs at a time in a process; the
wrappers do nothing when no probe is active. Several probes are active together when the run has
several models (``capture/watch.py``: one probe per watched object); a clip then measures only
the probes whose parameters it clips.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad as _clip_grad

from .fingerprint import GradMeter
from .objects import inner_optimizer

__all__ = ["GradProbe", "running_probe"]

_active: list[GradProbe] = []  # the probe of the step running now, if any


def _watching(fn: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(fn, "_replay_probe", False):
        return fn  # already wrapped (a reload of this module)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(_active) == 1:
            _active[0].measure_now()
        elif _active:
            args, clipped = _clipped(args, kwargs)
            for probe in list(_active):
                if clipped is None or probe.watches(clipped):
                    probe.measure_now()
        return fn(*args, **kwargs)

    wrapper._replay_probe = True  # type: ignore[attr-defined]
    return wrapper


def _clipped(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], Any]:
    """The parameters a clip was given, as a list (a generator is read once here and handed on
    as that list); ``None`` when they cannot be told (then every probe measures)."""
    params = args[0] if args else kwargs.get("parameters")
    if params is None:
        return args, None
    if isinstance(params, torch.Tensor):
        return args, [params]
    if not isinstance(params, (list, tuple)):
        params = list(params)
        if args:
            args = (params, *args[1:])
        else:
            kwargs["parameters"] = params
    return args, params


def _install() -> None:
    _clip_grad._clip_grads_with_norm_ = _watching(_clip_grad._clip_grads_with_norm_)
    # clip_grad_norm_ reaches the global above; these are called directly by users.
    for mod in (_clip_grad, torch.nn.utils):
        mod.clip_grad_value_ = _watching(mod.clip_grad_value_)  # type: ignore[attr-defined]  # torch stubs: not re-exported
    if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
        torch.nn.utils.clip_grads_with_norm_ = _watching(torch.nn.utils.clip_grads_with_norm_)


_install()


def running_probe() -> GradProbe | None:
    """The probe of the step running now (the recorder's or the replay engine's), if any."""
    return _active[-1] if _active else None


class GradProbe:
    """Measures the gradients of ``params`` once per step (see the module docstring).

    ``begin()`` before the step, ``end()`` after it (also when it raised); ``end`` returns
    ``(grad_norm, grad_absmax, optimizer_stepped)`` as :class:`GradMeter` gives them.
    """

    def __init__(self, params: list[torch.Tensor], optimizer: Any) -> None:
        """``optimizer``: the one that updates ``params`` (``None``: none does), or a list of
        them (a watched model several optimizers update: the first to step measures)."""
        self.meter = GradMeter(params)
        opts = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        # on the torch optimizer that really steps: inside accelerate's, Fabric's and
        # Lightning's wrappers, which may not run, or even have, its step hooks
        self._hooks = [
            inner_optimizer(o).register_step_pre_hook(self._pre_step) for o in opts if o is not None
        ]
        self._ids: frozenset[int] | None = None
        self.enabled = True
        self._on = False
        self._norm: Any = None
        self._absmax: Any = None
        self._measured = False
        self._at_step = True
        self.stepped = False

    def watch(self, params: list[torch.Tensor]) -> None:
        """Measure ``params`` from now on (the loop gave the optimizer a new param group)."""
        self.meter = GradMeter(params)
        self._ids = None

    def begin(self, *, at_step: bool = True) -> None:
        """``at_step=False``: the optimizer's step does not measure (it only marks the step as
        taken); a framework that runs the backward inside ``optimizer.step(closure)`` calls
        :meth:`measure_now` once the gradients are complete."""
        self._norm = self._absmax = None
        self._measured = self.stepped = False
        self._at_step = at_step
        self._on = True
        _active.append(self)

    def measure_at_hooks(self) -> None:
        """From now until the step ends, the optimizer's step does not measure (see ``begin``)."""
        self._at_step = False

    def measure_now(self) -> None:
        """The gradients are complete, not yet clipped or applied: measure them (once)."""
        if self._on:
            self._measure()

    def _measure(self, scale: Any = None) -> None:
        if not self._measured and self.enabled:
            self._measured = True
            self._norm, self._absmax = self.meter()
            if isinstance(scale, torch.Tensor) and self._norm is not None:  # (see the docstring)
                self._norm = self._norm / scale.to(self._norm.device)
                if self._absmax is not None:
                    self._absmax = self._absmax / scale.to(self._absmax.device)

    def watches(self, tensors: Any) -> bool:
        """Whether any of ``tensors`` is one of this probe's parameters."""
        if self._ids is None:
            self._ids = frozenset(id(p) for p in self.meter.params)
        return any(id(t) in self._ids for t in tensors)

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        """Before the update: measure now, or, for ``optimizer.step(closure)`` (LBFGS; any
        optimizer given a closure calls it first), right after the closure's first call: the
        gradients before the step are the ones it computes (those present now are the last
        step's, or none). The closure is handed on wrapped (a step pre-hook may replace the
        arguments; ``args[0]`` is the optimizer)."""
        if not self._on:
            return None
        self.stepped = True
        if not self._at_step or self._measured:
            return None
        closure = kwargs.get("closure") if "closure" in kwargs else (args[1:2] or [None])[0]
        if closure is None:
            self._measure(getattr(optimizer, "grad_scale", None))
            return None

        def measured_closure(*a: Any, **k: Any) -> Any:
            out = closure(*a, **k)
            self.measure_now()
            return out

        if "closure" in kwargs:
            return args, {**kwargs, "closure": measured_closure}
        return (args[0], measured_closure, *args[2:]), kwargs

    def end(self, *, measure: bool = True) -> tuple[Any, Any, bool]:
        """Stop watching; measure now if nothing did during the step (and ``measure``)."""
        if self._on:
            self._on = False
            try:  # (not contextlib.suppress: three Python calls more on every step)
                _active.remove(self)
            except ValueError:
                pass
        if measure:
            self._measure()
        return self._norm, self._absmax, self.stepped

    def close(self) -> None:
        self.end(measure=False)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

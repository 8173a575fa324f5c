"""Health of every model and optimizer among a run's named objects, not only ``model``.

A GAN passes ``objects={"model": netD, "optimizer": optD, "netG": netG, "optG": optG}``. The
plain health columns watch ``model`` and ``optimizer``; this module watches the others, each
under its own name (``netG__grad_norm``, ``netG__grad_nonfinite``, ``netG__param_fingerprint``,
``netG__param_nonfinite``; ``store/layout.py``), so bisect's first bad step is the first step
where *any* of them went bad (netG's gradients went NaN a step before netD's loss showed it).

What is watched: each named ``torch.nn.Module`` other than ``model`` (its trainable
parameters), and each named optimizer other than ``optimizer`` whose parameters no watched
module holds (its parameters). A module's gradient norm is measured like the run's own: before
any clip of its parameters, at the step pre-hook of the first optimizer that updates them, or at
the end of the step. The recorder and the replay engine both measure through :class:`ObjectWatch`,
so a recorded value and a replayed one come from the same place and compare bitwise.

Cost: nothing for a run with one model and one optimizer (nothing is watched); per watched
object, one gradient norm per step (three ops) and a parameter fingerprint at the fingerprint
steps.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from .fingerprint import absmax, exact_if_needed, param_fingerprint
from .objects import RunObjects, other_models
from .probe import GradProbe
from .readback import value_now

__all__ = ["ObjectWatch", "watched_objects"]


@dataclass
class _Watched:
    name: str
    params: list[torch.Tensor]
    probe: GradProbe


def watched_objects(
    objects: RunObjects, model: torch.nn.Module | None = None
) -> list[tuple[str, list[torch.Tensor], list[Any]]]:
    """``(name, parameters, optimizers updating them)`` of each watched object, in the order
    the objects were named. ``model``: the run's own module (the one inside a wrapper)."""
    model = model if model is not None else objects.model
    primary = {id(p) for p in model.parameters()}
    opts = [v for v in objects.named.values() if isinstance(v, torch.optim.Optimizer)]
    opt_ids = {id(o): {id(p) for g in o.param_groups for p in g["params"]} for o in opts}
    out: list[tuple[str, list[torch.Tensor], list[Any]]] = []
    held: set[int] = set(primary)
    for name, mod in other_models(objects, model).items():
        params: list[torch.Tensor] = [
            p for p in mod.parameters() if p.requires_grad and id(p) not in primary
        ]
        if not params:
            continue
        ids = {id(p) for p in params}
        held |= ids
        out.append((name, params, [o for o in opts if opt_ids[id(o)] & ids]))
    for name, opt in objects.named.items():
        if name == "optimizer" or not isinstance(opt, torch.optim.Optimizer):
            continue
        params = [p for g in opt.param_groups for p in g["params"] if id(p) not in held]
        if params:
            held |= {id(p) for p in params}
            out.append((name, params, [opt]))
    return out


class ObjectWatch:
    """Measures the watched objects of a run once per step (see the module docstring).

    ``begin()`` before the step, ``end()`` after it (also when it raised); ``into(health,
    params_too)`` adds the step's values to a health dict under ``<object>__<key>``.
    """

    def __init__(self, objects: RunObjects, model: torch.nn.Module | None = None) -> None:
        self._watched = [
            _Watched(n, params, GradProbe(params, opts))
            for n, params, opts in watched_objects(objects, model)
        ]
        self.names: tuple[str, ...] = tuple(w.name for w in self._watched)
        self._grads: list[tuple[Any, Any]] = []

    def __bool__(self) -> bool:
        return bool(self._watched)

    def begin(self, *, at_step: bool = True) -> None:
        for w in self._watched:
            w.probe.begin(at_step=at_step)

    def measure_now(self) -> None:
        for w in self._watched:
            w.probe.measure_now()

    def end(self, *, measure: bool = True) -> None:
        self._grads = [w.probe.end(measure=measure)[:2] for w in self._watched]

    def any_bad(self) -> bool:
        """A gradient norm measured this step is NaN/Inf (read where it is in host memory only,
        ``readback.value_now``: a device's is never waited for)."""
        for gn, _ in self._grads:
            value = value_now(gn) if isinstance(gn, torch.Tensor) else gn
            if isinstance(value, float) and not math.isfinite(value):
                return True
        return False

    def into(self, health: dict[str, Any], params_too: bool) -> None:
        """The step's gradient norms (and, with ``params_too``, parameter fingerprints and
        their exact non-finite flags) into ``health``."""
        for w, (gn, gmax) in zip(self._watched, self._grads):
            health[f"{w.name}__grad_norm"] = gn
            health[f"{w.name}__grad_absmax"] = gmax
            if params_too:
                fp = param_fingerprint(w.params)
                health[f"{w.name}__param_fingerprint"] = fp
                health[f"{w.name}__param_absmax"] = exact_if_needed(
                    fp, functools.partial(absmax, w.params)
                )

    def close(self) -> None:
        for w in self._watched:
            w.probe.close()

"""Where in the step an op runs: which of the run's modules is running, and its output: forward pre/post hooks on the model's
own modules (and the run's other models', named ``netG.<module>``), held weakly.

torch's ``ModuleTracker`` (``torch.utils.module_tracker``, ``torch.distributed._tools.mod_tracker``)
is not enough here: its ``parents`` is a set, so the innermost module of an op cannot be told;
its names are class-based (``Net.fc1``), not the ``state_dict`` paths the trace's module table
and a GAN's ``netG.`` prefix use; it hooks every module in the process (a loss module made in
the step would get rows); and in backward it attributes by module-level grad hooks, where the
tracer tags each autograd node with its forward op's module and line (``sites.py``; FINDINGS:
exact per-op attribution). A forward entered while an autograd node runs is a forward run again
by the backward (activation checkpointing): ``recomputing`` counts those on the stack.

``after_backward``: set by the first backward op, cleared by the next module forward outside a
backward; ops in between are of the phase ``other`` (gradient clipping, GradScaler unscaling).

``StepPhase``, the optimizer's part: inside ``optimizer.step`` (step pre/post hooks), and which
call of the closure handed to ``optimizer.step(closure)`` is running (LBFGS calls it many times
in one step), counted from 0; -1 outside any closure call. The step pre-hook hands ``step`` a
wrapped closure that counts its calls.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch.utils.hooks import RemovableHandle

from replay.capture.objects import inner_optimizer
from replay.trace.dispatch import Off, tensors
from replay.trace.source import Interner
from replay.trace.stats import floating, tensor_stats

__all__ = ["ModuleScope", "StepPhase", "Activation"]


class Activation(NamedTuple):
    """A module's output in the traced step (its first floating tensor): the ``act_*`` columns
    of the module table."""

    mean: float
    std: float
    absmax: float
    zero_frac: float
    nonfinite: float  # NaN, +inf and -inf values


class ModuleScope:
    def __init__(self, off: Off, roots: Sequence[tuple[str, object]]) -> None:
        self.off = off
        self.roots = roots  # ("", the model), then the other models by name
        self.modules = Interner()
        self.stack: list[int] = []
        self.recomputing = 0  # modules on the stack entered while an autograd node ran
        self.after_backward = False
        self.acts: dict[int, Activation] = {}  # module index -> its output
        self.on_recompute: Callable[[bool], None] = lambda entering: None
        self._in_backward: list[bool] = []  # per module on the stack: entered in a backward
        self._names: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> None:
        for prefix, root in self.roots:
            if not isinstance(root, torch.nn.Module):
                continue
            for name, mod in root.named_modules():
                if mod in self._names:
                    continue  # (a module the model holds too keeps the model's name)
                self._names[mod] = self.modules(".".join(n for n in (prefix, name) if n))
                self._handles += [
                    mod.register_forward_pre_hook(self._pre_forward),
                    mod.register_forward_hook(self._post_forward, always_call=True),
                ]

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def innermost(self) -> int:
        return self.stack[-1] if self.stack else -1

    def recomputed(self) -> bool:
        """The innermost module's forward is run again by the backward."""
        return bool(self.recomputing) and self._in_backward[-1]

    def _pre_forward(self, mod: torch.nn.Module, args: tuple[object, ...]) -> None:
        self.stack.append(self._names.get(mod, -1))
        in_backward = torch._C._current_autograd_node() is not None
        self._in_backward.append(in_backward)
        if in_backward:
            self.recomputing += 1
            self.on_recompute(True)
        else:
            self.after_backward = False

    def _post_forward(self, mod: torch.nn.Module, args: tuple[object, ...], out: object) -> None:
        if self.stack:
            self.stack.pop()
            if self._in_backward.pop():
                self.recomputing -= 1
                self.on_recompute(False)
        if self.off.on:
            return
        ts = [t for t in tensors(out) if floating(t)]
        if not ts:
            return
        try:
            with self.off, torch.no_grad():
                row, _ = tensor_stats(ts[0], hist=False)
        except Exception:  # noqa: BLE001 - one we cannot read: no activation; the step goes on
            return
        n = max(row.numel, 1.0)
        bad = row.nan + row.posinf + row.neginf
        self.acts[self._names.get(mod, -1)] = Activation(
            row.mean, row.std, row.absmax, row.zeros / n, bad
        )


class StepPhase:
    def __init__(self, off: Off, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.off = off
        self.optimizers = optimizers
        self.in_optimizer = False
        self.closure = -1  # the closure call running, -1: none
        self.closure_calls = 0
        self.on_optimizer_pre: Callable[[], None] | None = None  # set by the caller
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> None:
        # the optimizer itself, not a framework's wrapper (accelerate's AcceleratedOptimizer
        # is an Optimizer that never ran Optimizer.__init__: it has no hooks of its own)
        inner = {id(o): o for o in map(inner_optimizer, self.optimizers)}
        for opt in inner.values():
            self._handles.append(opt.register_step_pre_hook(self._pre_step))
            self._handles.append(opt.register_step_post_hook(self._post_step))

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _pre_step(
        self, opt: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> tuple[tuple[object, ...], dict[str, object]] | None:
        if self.on_optimizer_pre is not None and not self.in_optimizer:
            with self.off:
                self.on_optimizer_pre()
        self.in_optimizer = True
        # optimizer.step(closure): hand it a closure that counts its calls (args holds the
        # optimizer itself first)
        for i, a in enumerate(args):
            if callable(a) and not isinstance(a, torch.optim.Optimizer):
                return (*args[:i], self._counted(a), *args[i + 1 :]), kwargs
        closure = kwargs.get("closure")
        if callable(closure):
            return args, {**kwargs, "closure": self._counted(closure)}
        return None

    def _counted(self, closure: Callable[[], object]) -> Callable[[], object]:
        def counted() -> object:
            outer = self.closure
            self.closure = self.closure_calls
            self.closure_calls += 1
            try:
                return closure()
            finally:
                self.closure = outer

        return counted

    def _post_step(
        self, opt: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        self.in_optimizer = False

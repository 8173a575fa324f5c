"""The global state the tracer replaces while it runs, saved on enter and put back on exit:

- ``Function.apply``: a custom ``torch.autograd.Function``'s nodes are tagged where it is applied;
- ``torch.autograd.backward``: each backward's non-finite roots are noticed (a closure's loss
  that LBFGS only turns into a Python number is never returned, yet its backward made the
  gradients);
- ``warnings.showwarning``: a warning torch raises from inside an op (``TORCH_WARN``: ``std()``
  of one value) names the innermost Python frame, the tracer's own that ran the op; it is shown
  at the user's line that ran the op instead. Filters and "once" registries are as they were;
- numpy's error state (``quiet_numpy``: statistics of non-finite values warn otherwise).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from replay.trace.dispatch import Off, tensors
from replay.trace.sites import Sites
from replay.trace.stats import quiet_numpy

__all__ = ["Patches"]


class Patches:
    def __init__(
        self,
        off: Off,
        sites: Sites,
        notice: Callable[[torch.Tensor, str], None],
        op_files: tuple[str, ...],
    ) -> None:
        self.off = off
        self.sites = sites
        self.notice = notice
        self.op_files = op_files  # the files whose frames run ops (a warning's filename then)
        self._saved: list[tuple[object, str, object, object]] = []  # (owner, name, was, is)
        self._quiet = quiet_numpy()

    def _patch(self, owner: object, name: str, new: object) -> None:
        was = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)
        self._saved.append((owner, name, was, new))
        setattr(owner, name, new)

    def __enter__(self) -> None:
        self._patch(torch.autograd.function.Function, "apply", classmethod(self._apply()))
        self._patch(torch.autograd, "backward", self._backward(torch.autograd.backward))
        self._patch(warnings, "showwarning", self._showwarning(warnings.showwarning))
        self._quiet.__enter__()

    def __exit__(self, *exc: object) -> None:
        for owner, name, was, new in reversed(self._saved):
            if owner is warnings and warnings.showwarning is not new:
                continue  # (not if the step replaced it since)
            setattr(owner, name, was)  # (setattr: an assignment reads as a method override)
        self._saved = []
        self._quiet.__exit__(None, None, None)

    def _apply(self) -> Callable[..., object]:
        original: classmethod[Any, ..., Any] = vars(torch.autograd.function.Function)["apply"]
        off, sites = self.off, self.sites

        def apply(cls: type[torch.autograd.Function], /, *args: object, **kwargs: object) -> object:
            out = original.__func__(cls, *args, **kwargs)
            if not off.on:
                with off:  # grad_fn lookups go through torch functions too
                    for t in tensors(out):
                        if t.grad_fn is not None:
                            sites.tag(t.grad_fn, sys._getframe(1), function=cls.__name__)
                            break
            return out

        return apply

    def _backward(self, original: Callable[..., None]) -> Callable[..., None]:
        off, notice = self.off, self.notice

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> None:
            if not off.on:
                roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or [])
                with off:
                    for t in roots:
                        if isinstance(t, torch.Tensor):
                            notice(t, "the root of a backward (a loss)")
            original(tensors, *args, **kwargs)

        return backward

    def _showwarning(self, original: Callable[..., None]) -> Callable[..., None]:
        locs, op_files = self.sites.locs, self.op_files

        def showwarning(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            if filename in op_files:
                f = locs.user_frame(sys._getframe(1))
                if f is not None:
                    filename, lineno, line = f.f_code.co_filename, f.f_lineno, None
            original(message, category, filename, lineno, file, line)

        return showwarning

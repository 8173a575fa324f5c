"""The tracer's two private modes, thin: each hands every op or torch function on
(``Tracer.on_op``, ``Sites.on_function``) unless the tracer's own work is running (``Off``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence

import torch
from torch._ops import OpOverload
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Off", "DispatchMode", "FunctionMode", "dispatch_mode", "compiled_frames", "tensors"]

OnOp = Callable[[OpOverload[..., object], tuple[object, ...], dict[str, object]], object]
OnFunction = Callable[[Callable[..., object], Sequence[object], dict[str, object]], object]


class Off:
    """Set while the tracer's own work runs (statistics, hooks): its modes pass ops through
    untraced and its hooks do nothing. ``with off:`` sets it for a block (and clears it after)."""

    on = False

    def __enter__(self) -> None:
        self.on = True

    def __exit__(self, *exc: object) -> None:
        self.on = False


def _dispatch(
    self: DispatchMode,
    func: OpOverload[..., object],
    types: Collection[type],
    args: tuple[object, ...] = (),
    kwargs: dict[str, object] | None = None,
) -> object:
    kwargs = kwargs or {}
    if self.off.on:
        return func(*args, **kwargs)
    return self.on_op(func, args, kwargs)


class DispatchMode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch: untyped __init_subclass__
    """Called through dynamo's disable wrapper, which ``TorchDispatchMode.__init_subclass__``
    puts around a subclass's own ``__torch_dispatch__``."""

    def __init__(self, off: Off, on_op: OnOp) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch stubs
        self.off, self.on_op = off, on_op

    __torch_dispatch__ = _dispatch


class _DirectDispatchMode(DispatchMode):  # type: ignore[no-untyped-call]  # as above
    """The same mode, its ``__torch_dispatch__`` called as it is instead of through dynamo's
    disable wrapper (about 6 us an op on the LSTMCell x LBFGS step, idle). Not where
    compiled code may run: a re-entered compiled model's trace then named no op."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    __torch_dispatch__ = _dispatch


def compiled_frames() -> int:
    """How many frames dynamo has compiled in this process (0 before it was imported)."""
    dynamo = sys.modules.get("torch._dynamo")
    return int(dynamo.utils.counters.get("frames", {}).get("total", 0)) if dynamo else 0


def dispatch_mode(off: Off, on_op: OnOp, objects: Sequence[object], direct: bool) -> DispatchMode:
    """With ``direct``, the unwrapped mode unless compiled code may run in the step: dynamo
    compiled a frame before, or one of ``objects`` is compiled. (Not "dynamo imported": every
    optimizer's constructor imports it.) A step that first compiles inside the trace gets the
    unwrapped mode, which misses the compiled ops: ``Tracer.compiled_during`` says so, and the
    step is traced again with the wrapped one."""
    dynamo = sys.modules.get("torch._dynamo")
    if direct and dynamo is not None:
        optimized = dynamo.eval_frame.OptimizedModule
        if compiled_frames() or any(isinstance(o, optimized) for o in objects):
            return DispatchMode(off, on_op)
    return (_DirectDispatchMode if direct else DispatchMode)(off, on_op)


class FunctionMode(TorchFunctionMode):
    def __init__(self, off: Off, on_function: OnFunction) -> None:
        super().__init__()
        self.off, self.on_function = off, on_function

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: Collection[type],
        args: Sequence[object] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        if self.off.on:
            return func(*args, **kwargs)
        return self.on_function(func, args, kwargs)


def tensors(x: object) -> list[torch.Tensor]:
    """The tensors in an op's arguments or results: nested tuples, lists and dicts walked by
    hand (pytree's general flattening cost more than many small ops themselves)."""
    out: list[torch.Tensor] = []
    collect(x, out)
    return out


def collect(x: object, out: list[torch.Tensor]) -> None:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (tuple, list)):
        for y in x:
            if isinstance(y, torch.Tensor):
                out.append(y)
            elif isinstance(y, (tuple, list, dict)):
                collect(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            collect(y, out)

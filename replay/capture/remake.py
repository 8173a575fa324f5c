"""How a replay makes again a step function the run changed part-way (format.md: ``step_fn``).

A replay by re-entry is handed one step function, the program's first. A program that hands
its step another one later runs steps a replay would otherwise run with the first:

- the same code over other objects (mnist_forward_forward: each layer's ``train()`` hands
  ``step``, a closure over ``self`` and the layer's inputs): the recorder keeps what the new
  closure holds where it differs from the first's (``cells``), each a named run object, a
  number, a string or a tensor in host memory (recorded, as a batch is); a replay makes the
  closure again from the first one's code with those cells;
- another function of the program's own file (a GAN alternating ``train_d`` and ``train_g``):
  kept by name (``function``); a replay takes it from the program's module, which the re-run
  has loaded, and only from there (a recording names no other code to run).

Anything else (a nested closure that changed, a cell holding another kind of object, a tensor
on a device) is kept as changed but not as remade: the replay says why that step differs.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from .bounded import value_excess

__all__ = ["remake_spec", "remake", "code_of"]

_PLAIN = (int, float, bool, str, type(None))


def code_of(fn: Any) -> types.CodeType | None:
    """The code object that makes ``fn`` the step it is: a closure made again each epoch has
    the same one (``None`` for a callable without one: a partial, an object with __call__)."""
    fn = fn.__func__ if isinstance(fn, types.MethodType) else fn
    return fn.__code__ if isinstance(fn, types.FunctionType) else None


def _cell_value(x: Any, names: dict[int, str]) -> dict[str, Any] | None:
    if id(x) in names:
        return {"object": names[id(x)]}
    if isinstance(x, _PLAIN) or (isinstance(x, torch.Tensor) and x.device.type == "cpu"):
        if value_excess(x) is None:
            return {"value": x.detach() if isinstance(x, torch.Tensor) else x}
    return None


def _names(named: dict[str, Any]) -> dict[int, str]:
    """Every run object and every submodule of one, by id: ``model``, ``model.blocks.1`` (a
    closure over one layer of the model: greedy layer-wise training)."""
    names: dict[int, str] = {}
    for k, v in named.items():
        if isinstance(v, torch.nn.Module):
            for path, m in v.named_modules():
                names.setdefault(id(m), f"{k}.{path}" if path else k)
        names[id(v)] = k
    return names


def _object(named: dict[str, Any], name: str) -> Any:
    root, _, path = name.partition(".")
    obj = named.get(root)
    if path and isinstance(obj, torch.nn.Module):
        try:
            return obj.get_submodule(path)
        except AttributeError:
            return None
    return obj if not path else None


def remake_spec(first: Any, fn: Any, named: dict[str, Any]) -> dict[str, Any] | None:
    """What a replay needs to make ``fn`` again from the program's ``first`` step function and
    the run objects ``named``; ``None`` when it cannot. On the training thread, at each change
    (a loop alternating two functions: every step), so the objects' modules are walked only
    when a cell differs."""
    if not isinstance(fn, types.FunctionType) or not isinstance(first, types.FunctionType):
        return None  # (a bound method is not a FunctionType)
    if fn.__code__ is not first.__code__:
        if fn.__closure__ or "<locals>" in fn.__qualname__ or fn.__module__ != first.__module__:
            return None
        if fn.__code__.co_filename != first.__code__.co_filename:
            return None
        return {"function": fn.__qualname__}
    cells: dict[str, Any] = {}
    names: dict[int, str] | None = None
    for name, a, b in zip(fn.__code__.co_freevars, first.__closure__ or (), fn.__closure__ or ()):
        try:
            x, y = a.cell_contents, b.cell_contents
        except ValueError:  # a cell not yet filled
            return None
        if x is y:
            continue
        names = _names(named) if names is None else names
        kept = _cell_value(y, names)
        if kept is None:
            return None
        cells[name] = kept
    return {"cells": cells}


def remake(first: Any, spec: dict[str, Any], named: dict[str, Any]) -> Any:
    """The step function ``spec`` describes, made from the live program's ``first`` and its
    objects ``named``; ``None`` when it cannot be (the program differs from the recording's,
    or the spec is not one :func:`remake_spec` writes)."""
    if not isinstance(first, types.FunctionType):
        return None
    function = spec.get("function")
    if isinstance(function, str):
        module = sys.modules.get(first.__module__)
        fn = getattr(module, function, None) if "." not in function else None
        ok = (
            isinstance(fn, types.FunctionType)
            and not fn.__closure__
            and fn.__code__.co_filename == first.__code__.co_filename
        )
        return fn if ok else None
    cells = spec.get("cells")
    if not isinstance(cells, dict) or first.__closure__ is None:
        return None
    out = []
    for name, cell in zip(first.__code__.co_freevars, first.__closure__):
        kept = cells.get(name)
        if kept is None:
            out.append(cell)
        elif isinstance(kept, dict) and isinstance(kept.get("object"), str):
            obj = _object(named, kept["object"])
            if obj is None:
                return None
            out.append(types.CellType(obj))
        elif isinstance(kept, dict) and "value" in kept:
            out.append(types.CellType(kept["value"]))
        else:
            return None
    if set(cells) - set(first.__code__.co_freevars):
        return None
    return types.FunctionType(
        first.__code__, first.__globals__, first.__name__, first.__defaults__, tuple(out)
    )

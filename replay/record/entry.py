"""Recording how replay finds the run's objects and step again.

Two ways (docs/reentry.md). **Re-entry** (the default): replay runs the recorded program again
(:func:`describe_program`) and takes the objects and the step function the program hands its
first Recorder; the step may then be any callable (:func:`describe_step`). **Entry points**
(``build_fn`` given): replay imports ``build_fn`` and ``step_fn`` again, so they must be module-level functions: a lambda, a closure or a
bound method cannot be found by name in a fresh process. We record the module, the qualified
name, the file (for a script run as ``__main__``), its source text and its sha256, so replay can
say which file it imports and warn when it changed.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import multiprocessing
import os
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from ..capture.installed import installed
from ..capture.objects import RunObjects, StepCall
from ..capture.remake import code_of, remake_spec
from ..errors import EntryPointError, warn_at_user_line
from .unheld import UnheldState

__all__ = ["describe_entry", "describe_program", "describe_step", "read_source", "StepFunction"]


def read_source(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


def describe_entry(fn: Callable[..., Any], role: str) -> dict[str, Any]:
    """``{"module", "qualname", "path", "sha256"}`` for ``fn``; refuses what cannot be imported."""
    if not callable(fn):
        raise EntryPointError(f"{role} must be a function, got {type(fn).__name__}")
    if inspect.ismethod(fn):
        raise EntryPointError(
            f"{role}={fn.__qualname__} is a bound method; replay imports {role} by name in a "
            "fresh process, so pass a module-level function (def at the top level of a module)"
        )
    qualname = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if qualname is None or module is None:
        raise EntryPointError(f"{role} has no __qualname__/__module__; pass a def'd function")
    if "<lambda>" in qualname:
        raise EntryPointError(
            f"{role} is a lambda; replay imports {role} by name in a fresh process, which a "
            "lambda has none of. Define it with def at module level"
        )
    if "<locals>" in qualname:
        raise EntryPointError(
            f"{role}={qualname} is defined inside another function (a closure); replay imports "
            f"{role} by name in a fresh process. Move it to module level"
        )
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None) if mod is not None else None
    if path is None:
        try:
            path = inspect.getsourcefile(fn)
        except TypeError:
            path = None
    if path is None:
        raise EntryPointError(
            f"{role}={module}.{qualname} has no source file (defined interactively?); put it "
            "in a .py file so replay can import it again"
        )
    path = os.path.abspath(path)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn and getattr(obj, "__wrapped__", None) is not fn:
        raise EntryPointError(
            f"{role}: {module}.{qualname} does not name this function at module level; "
            "replay could not find it again"
        )
    source = read_source(path)
    return {
        "module": module,
        "qualname": qualname,
        "path": path,
        "sha256": hashlib.sha256(source.encode()).hexdigest() if source is not None else None,
        "is_script": module == "__main__",
    }


def describe_step(fn: Callable[..., Any]) -> dict[str, Any]:
    """The step function as the recording shows it when replay re-enters the program: any
    callable (a closure, a bound method, a lambda) the program hands the Recorder again."""
    if not callable(fn):
        raise EntryPointError(f"step_fn must be a function, got {type(fn).__name__}")
    code = getattr(inspect.unwrap(fn), "__code__", None) or getattr(
        getattr(fn, "__func__", None), "__code__", None
    )
    path = os.path.abspath(code.co_filename) if code is not None else ""
    return {
        "module": str(getattr(fn, "__module__", "") or ""),
        "qualname": str(getattr(fn, "__qualname__", type(fn).__name__)),
        "path": path,
        "is_script": getattr(fn, "__module__", None) == "__main__",
        "reentry": True,
    }


def describe_program() -> tuple[dict[str, Any] | None, str | None]:
    """How to run this process's program again: ``({"kind", "path", "module", "sha256"}, None)``,
    or ``(None, why not)`` (an interactive session, a program started by an installed tool such
    as pytest or a notebook kernel, whose re-run would not be the user's training)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None, "the program has no main file (an interactive session or a notebook)"
    path = os.path.abspath(path)
    if not os.path.isfile(path):  # `python - < train.py`: its __file__ is '<stdin>'
        return None, f"the program's main file {path} is not a file (a program read from stdin)"
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if installed(path):
        return None, (
            f"the program's main file {path} belongs to an installed package (run by a tool, "
            "not as `python your_script.py`)"
        )
    program: dict[str, Any] = {
        "kind": "module" if isinstance(name, str) and name and name != "__main__" else "script",
        "path": path,
    }
    if program["kind"] == "module":
        program["module"] = name
    if (source := read_source(path)) is not None:
        program["sha256"] = hashlib.sha256(source.encode()).hexdigest()
    return program, None


def started_by_multiprocessing() -> str | None:
    """Why a Recorder without ``build_fn`` in this process cannot be re-entered, when
    multiprocessing started the process (hogwild's ``mp.Process`` workers, ``mp.spawn``): replay
    runs the program's command again and takes over a Recorder in that command's own process,
    never in one it starts; else ``None``."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return None
    return (
        f"its Recorder is in a process multiprocessing started (from pid {parent.pid}), and "
        "replay takes over a Recorder only in the process of the program's own command"
    )


def _torch_state(x: Any) -> bool:
    """What a step computes with: a tensor, a module, an optimizer (a dict of meters it only
    appends to, a timer, a counter for its logs: not looked at)."""
    return isinstance(x, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer))


def _same_state(x: Any, y: Any) -> bool:
    """Two objects of a step's closure that are not the same object, yet the same to the step:
    a module without parameters or buffers (a loss made again each epoch), CPU tensors of the
    same values. A tensor on a device is not compared (that would wait for the device)."""
    if isinstance(x, torch.nn.Module) and type(x) is type(y):
        return not any(True for _ in itertools.chain(x.parameters(), x.buffers()))
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if not (x.is_cpu and y.is_cpu):
            return True
        return x.dtype == y.dtype and x.shape == y.shape and bool(torch.equal(x, y))
    return False


def changed_capture(before: Any, after: Any, depth: int = 0) -> str | None:
    """The name of the first tensor, module or optimizer that ``after``, a step function of the
    same code as ``before``, reads through its closure (or as ``self``) that is not the one
    ``before`` read. A closure made again each epoch over the same objects is the same step
    (``None``); the closures of nested functions it captures are compared too (timm's
    ``lambda batch: _backward(_forward(batch))``, both made again each batch)."""
    if isinstance(before, types.MethodType) and isinstance(after, types.MethodType):
        x, y = before.__self__, after.__self__
        if x is not y and _torch_state(y) and not _same_state(x, y):
            return "self"
        before, after = before.__func__, after.__func__
    if not (isinstance(before, types.FunctionType) and isinstance(after, types.FunctionType)):
        return None
    if before.__code__ is not after.__code__:  # another function: said as such (use)
        return None
    for name, a, b in zip(
        after.__code__.co_freevars, before.__closure__ or (), after.__closure__ or ()
    ):
        try:
            x, y = a.cell_contents, b.cell_contents
        except ValueError:  # a cell not yet filled
            continue
        if x is y:
            continue
        if isinstance(x, types.FunctionType) and isinstance(y, types.FunctionType):
            inner = changed_capture(x, y, depth + 1) if depth < 3 else None
            if inner is not None:
                return f"{name}.{inner}"
        elif (_torch_state(x) or _torch_state(y)) and not _same_state(x, y):
            return name
    return None


def _qualname(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)[:200]


class StepFunction:
    """The step function a Recorder runs (``fn``, the one the last step was handed) and how it
    is called: a closure made again each epoch is the same step (the same code)."""

    def __init__(self, fn: Callable[..., Any] | None, objects: RunObjects) -> None:
        self.fn, self.call = fn, StepCall(fn, objects) if fn is not None else None
        self.first = fn  # the program's first: the one a replay by re-entry is handed
        self._code, self._said = code_of(fn), False  # the first step function's code
        self._said_capture = False
        # the step function of step t, where it is not the one the step before was handed
        # (step record's ``step_fn``: what verify names when that step does not replay)
        self.changed: dict[str, Any] | None = None
        # the last change, with the step it was made at: repeated in the record of each step a
        # snapshot is taken before, so that a replay from any snapshot knows the function
        self.in_effect: dict[str, Any] | None = None
        self.unheld = UnheldState()  # the state its code reaches that the Recorder does not hold

    def _note(
        self, fn: Callable[..., Any], over: str | None, objects: RunObjects, t: int, reentry: bool
    ) -> bool:
        """The step record's ``step_fn``: what changed, and how a replay makes it again
        (``capture/remake.py``) where it can; whether it can (a replay by re-entry: one from
        ``build_fn`` is handed the entry's function, which no record changes)."""
        self.changed = {"qualname": _qualname(fn), "over": over}
        try:
            spec = remake_spec(self.first, fn, objects.named) if reentry else None
        except Exception:  # noqa: BLE001 - a step function it cannot describe stays changed
            spec = None
        if spec is not None:
            self.changed["remake"] = spec
        self.in_effect = {**self.changed, "since": t}
        return spec is not None

    def use(
        self, fn: Callable[..., Any], objects: RunObjects, entry: dict[str, Any], t: int
    ) -> bool:
        """``fn`` was handed to step ``t``. The first one is described in ``entry`` (then
        ``True``: the recorder names the state it reaches). Every step handed another function
        than the step before, or the same code over other objects, is noted in ``changed``
        (for its record, with how a replay makes it again: ``capture/remake.py``); one a
        replay cannot make again is said once: another function than the first, and the same
        function over other objects or values than the step before."""
        code = code_of(fn)
        before, self.fn = self.fn, fn
        if self.call is None:
            self.call, self._code, self.first = StepCall(fn, objects), code, fn
            if "build_fn" not in entry:
                entry["step_fn"] = describe_step(fn)
            return True
        if code is not None and code is self._code:
            self.call = self.call.with_step(fn)
        else:
            self.call = StepCall(fn, objects)  # (a step that takes no batch: EntryPointError)
        reentry = "build_fn" not in entry
        if code_of(before) is not code:
            remade = self._note(fn, None, objects, t, reentry)
            if code is not self._code and not self._said and not remade:
                self._said = True
                first = entry.get("step_fn", {}).get("qualname", "the first")
                warn_at_user_line(
                    f"replay: step {t} was handed another step function ({_qualname(fn)}) than "
                    f"the first step ({first}); a replay runs every step with the one its first "
                    "step is handed, so steps made by another function will not replay",
                )
            return False
        name = changed_capture(before, fn)
        if name is None:
            return False
        if not self._note(fn, name, objects, t, reentry) and not self._said_capture:
            self._said_capture = True
            warn_at_user_line(
                f"replay: step {t} was handed {_qualname(fn)} over another {name} than the step "
                "before; a replay runs every step with the closure its first step is handed, "
                "so steps from here on will not replay: hand what differs to the step, as its "
                "batch or a per-step value (rec.step(batch, name=value)), instead of through "
                "its closure",
            )
        return False

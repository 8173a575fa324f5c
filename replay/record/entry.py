"""Recording the entry points (``build_fn``, ``step_fn``) as importable references.

Replay imports them again, so they must be module-level functions: a lambda, a closure or a
bound method cannot be found by name in a fresh process. We record the module, the qualified
name, the file (for a script run as ``__main__``), its source text and its sha256, so replay can
say which file it imports and warn when it changed.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import EntryPointError

__all__ = ["describe_entry", "read_source"]


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

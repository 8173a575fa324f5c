"""Which class a recorded object batch is made again as (an ``object`` node, docs/format.md).

A recording names the class of each object batch by ``module`` and ``qualname``; a replay makes
it without calling ``__init__`` and sets its attributes from the file. Any class loaded in the
process would do that (``tempfile._TemporaryFileCloser`` with a victim's name deletes the victim
when its finaliser runs), so a replay makes a batch as its own class only when the class is

- **the program's own**: defined in a file under the directory of a file this replay ran or
  imported as the program (the re-run script, the imported ``build_fn``/``step_fn`` file; a
  script inside a package counts from the package's root), and not in the standard library, an
  installed package, torch, numpy or replay itself; looked up in the modules already loaded,
  never imported, and found where the file says it is defined (not re-exported under that name);
- **plain to make**: no class of its MRO (``object`` and builtin types aside) defines a
  finaliser (``__del__``), its own construction or reconstruction (``__new__``, ``__reduce__``,
  ``__reduce_ex__``, ``__getstate__``, ``__setstate__``) or attribute machinery that runs on
  every access (``__getattribute__``, ``__setattr__``, ``__delattr__``). The frozen-dataclass
  ``__setattr__``/``__delattr__`` and slotted-dataclass state methods that ``dataclasses``
  writes are allowed. ``__getattr__`` is allowed: it runs only when the program's own code reads
  an attribute the object lacks (Hugging Face's ``BatchEncoding`` shape).

Anything else is a plain stand-in with the same attributes (``capture.tensors.live_object``);
a class that is loaded but refused is named once on stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from ..capture.installed import installed_dirs, under

__all__ = ["OwnClasses", "why_not_built"]

# Methods that run code of the class's own while an object is made, kept or dropped, or on every
# attribute access: a class defining one is not made from a file's attributes.
_NOT_PLAIN = (
    "__del__",
    "__new__",
    "__reduce__",
    "__reduce_ex__",
    "__getstate__",
    "__setstate__",
    "__getattribute__",
    "__setattr__",
    "__delattr__",
)


def _made_by_dataclasses(owner: type, name: str, fn: Any) -> bool:
    """``fn`` is a method ``dataclasses`` wrote for ``owner`` (frozen: ``__setattr__`` and
    ``__delattr__`` raise; slots: ``__getstate__``/``__setstate__`` copy the slots)."""
    params = vars(owner).get("__dataclass_params__")
    if params is None:
        return False
    if getattr(fn, "__module__", None) == "dataclasses":
        return name in ("__getstate__", "__setstate__")
    code = getattr(fn, "__code__", None)
    return (
        name in ("__setattr__", "__delattr__")
        and bool(getattr(params, "frozen", False))
        and code is not None
        and code.co_filename.startswith("<")  # generated source, no file of the program's
        and getattr(fn, "__qualname__", "") == f"{owner.__qualname__}.{name}"
    )


def why_not_built(cls: type) -> str | None:
    """Why ``cls`` is not made without its constructor (``None``: it may be)."""
    for c in cls.__mro__:
        if c is object or c.__module__ == "builtins":
            continue
        for name in _NOT_PLAIN:
            fn = vars(c).get(name)
            if fn is not None and not _made_by_dataclasses(c, name, fn):
                return f"{c.__module__}.{c.__qualname__} defines {name}"
    return None


def _package_root(path: str) -> str:
    """The directory of ``path``, or of the outermost package it is in."""
    d = os.path.dirname(path)
    while os.path.isfile(os.path.join(d, "__init__.py")) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    return d


class OwnClasses:
    """``(module, qualname) -> class or None``: the class an object batch is made again as,
    when it is the program's own and plain to make (see the module docstring)."""

    def __init__(self, files: Iterable[str], log: Callable[[str], None] | None = None) -> None:
        self.roots = sorted({_package_root(os.path.realpath(f)) for f in files if f})
        libs = ("replay", "torch", "numpy")
        wheres = [getattr(sys.modules.get(m), "__file__", None) for m in libs]
        dirs = {os.path.dirname(os.path.realpath(w)) for w in wheres if isinstance(w, str)}
        self.excluded = sorted({*installed_dirs(), *dirs})
        self.log = log
        self._said: set[tuple[str, str]] = set()

    def own_file(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(under(real, r) for r in self.roots) and not any(
            under(real, d) for d in self.excluded
        )

    def __call__(self, module: str, qualname: str) -> type | None:
        cls = _loaded(module, qualname)
        if cls is None:
            return None  # not loaded: a stand-in, as for a class the program no longer has
        where = getattr(sys.modules.get(cls.__module__), "__file__", None)
        why: str | None
        if cls.__module__ != module or cls.__qualname__ != qualname:
            why = f"it is {cls.__module__}.{cls.__qualname__}, not defined under that name"
        elif not isinstance(where, str) or not self.own_file(where):
            why = "it is not a class of the program's own files"
        else:
            why = why_not_built(cls)
        if why is None:
            return cls
        if self.log is not None and (module, qualname) not in self._said:
            self._said.add((module, qualname))
            self.log(
                f"replay: note: a batch of class {module}.{qualname} is replayed as a plain "
                f"object with its attributes, not made as that class: {why}"
            )
        return None


def _loaded(module: str, qualname: str) -> type | None:
    """The class ``module.qualname`` if that module is loaded, found by reading namespaces
    (never a module's ``__getattr__``, never an import)."""
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None:
            return None
        try:
            obj = vars(obj).get(part)
        except TypeError:  # no __dict__
            return None
    return obj if isinstance(obj, type) else None

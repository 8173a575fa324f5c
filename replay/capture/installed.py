"""Where the standard library and installed packages live: a program whose main file is there
was started by a tool, and replay never imports an entry point or a class from there."""

from __future__ import annotations

import contextlib
import os
import site
import sysconfig

__all__ = ["installed", "installed_dirs", "under"]


def installed_dirs() -> list[str]:
    """The standard library's and the installed packages' folders (real paths)."""
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    dirs = {os.path.realpath(paths[k]) for k in keys if paths.get(k)}
    with contextlib.suppress(AttributeError, TypeError):  # a virtualenv's old site module
        dirs.update(os.path.realpath(p) for p in site.getsitepackages())
        dirs.add(os.path.realpath(site.getusersitepackages()))
    return sorted(dirs)


def under(path: str, d: str) -> bool:
    """``path`` is the folder ``d`` or lies below it."""
    return path == d or path.startswith(d.rstrip(os.sep) + os.sep)


def installed(path: str) -> bool:
    """``path`` belongs to the standard library or an installed package."""
    real = os.path.realpath(path)
    return any(under(real, d) for d in installed_dirs())

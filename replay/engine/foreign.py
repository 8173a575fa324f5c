"""Refusing a foreign recording before any of its code runs (docs/trust.md).

A recording runs code (its program again, or its ``build_fn``) only when it verifies with this
user's key or the user trusted it (``replay/trust.py``), or with ``--trust`` given once. The
refusal is one line that names what would run: the exact command, in its working directory, and
the file that command resolves to (for ``python -m MOD``: where ``MOD`` is found from that
directory, found without importing anything).
"""

from __future__ import annotations

import importlib.machinery
import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

from ..errors import EntryPointError
from ..trust import standing

if TYPE_CHECKING:
    from ..store.reader import Recording
    from .entry import EntryOverride

__all__ = ["check_trusted", "command_of", "module_file"]


def command_of(program: dict[str, Any], env: dict[str, Any]) -> str:
    """``python -m MOD ARGV`` or ``python PATH ARGV`` as the recording would run it, quoted as
    a shell would need it."""
    argv = env.get("argv")
    args = [a for a in argv[1:] if isinstance(a, str)] if isinstance(argv, list) else []
    head = (
        ["python", "-m", str(program.get("module"))]
        if program.get("kind") == "module"
        else ["python", str(program.get("path"))]
    )
    return shlex.join(head + args)


def module_file(name: str, first: str) -> str:
    """The file ``python -m name`` runs with ``first`` as ``sys.path[0]``: found by the path
    finder, one package at a time, without importing (a package's ``__init__`` is code)."""
    parts = name.split(".")
    if not parts or not all(p.isidentifier() for p in parts):
        return f"no module (the name {name!r} is not one)"
    if len(parts) == 1 and name in sys.builtin_module_names:
        return f"the built-in module {name}"
    # as runpy sees it: the working directory put first (reentry.py), then this sys.path
    paths: list[str] | None = [first, *sys.path]
    spec = None
    for part in parts:
        spec = importlib.machinery.PathFinder.find_spec(part, paths)
        if spec is None:
            return f"no file (module {name!r} is not found from {first})"
        paths = list(spec.submodule_search_locations or []) or None
    assert spec is not None
    if spec.submodule_search_locations:  # a package: `-m pkg` runs pkg/__main__.py
        main = importlib.machinery.PathFinder.find_spec(
            "__main__", list(spec.submodule_search_locations)
        )
        return str(main.origin) if main is not None and main.origin else str(spec.origin)
    return str(spec.origin)


def _what_runs(rec: Recording, program_runs: bool) -> str:
    """```python -m timeit -s ...` in /cwd (file /usr/lib/python3.11/timeit.py)``, or the entry
    points a ``build_fn`` recording imports."""
    env = rec.env
    got = env.get("cwd")
    cwd = got if isinstance(got, str) and got else os.getcwd()
    program = rec.program
    if program is not None and (program_runs or "build_fn" not in rec.entry):
        if program.get("kind") == "module":  # from the working directory, as reentry.py runs it
            resolved = module_file(str(program.get("module")), cwd)
        else:
            resolved = str(program.get("path"))
        return f"`{command_of(program, env)}` in {cwd} (file {resolved})"
    files = sorted(
        {str(e.get("path")) for e in rec.entry.values() if isinstance(e, dict) and e.get("path")}
    )
    return f"the entry points in {', '.join(files) or '(none named)'} (in {cwd})"


def check_trusted(
    rec: Recording, entry: EntryOverride | None, trust: bool, *, program: bool = False
) -> None:
    """Raise a one-line :class:`EntryPointError` (exit 4) unless the user vouches for ``rec``:
    it verifies with their key, they trusted it, or ``trust`` (``--trust``). ``entry``
    (``--entry``, the user naming their own files) is their choice for the entry points.
    ``program``: what would run is the recorded program (re-entry), not the entry points."""
    if trust or entry is not None:
        return
    got = standing(rec.meta, rec.sources, rec.run_id, rec.format_version)
    if got.runs:
        return
    raise EntryPointError(
        f"{rec.path} is foreign ({got.why}); replaying it would run {_what_runs(rec, program)}: read "
        f"that, then pass --trust (this once) or run `replay trust {shlex.quote(rec.path)}` "
        "(remember it)"
    )

"""Importing the recorded entry points again: the only place ``replay`` runs user code.

A script recorded as ``__main__`` is imported as a file under a private module name, so its
``if __name__ == "__main__":`` training loop does not run; a module is imported by name from the
project root its recorded file implies (never from the recording's working directory, which a
crafted recording could point anywhere). An entry point must be a function written in that
file: never one of the standard library or an installed package. A recording this user did not
sign or trust is imported only with ``--trust`` (``foreign.py``, docs/trust.md). We say on stderr which file is imported and, when its
source changed since the recording, show a short diff: a replay of different code is a different
experiment, and the user must know.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..capture.installed import installed
from ..errors import EntryPointError, UsageError

__all__ = [
    "EntryPoints",
    "EntryOverride",
    "parse_entry_override",
    "load_entry_points",
    "recorded_process",
]

_DIFF_LINES = 40  # enough to see what changed, short enough not to bury the verdict
_ENTRY_HINT = "pass --entry MODULE_OR_FILE:build,step to say where build_fn and step_fn live now"


@dataclass(frozen=True)
class EntryOverride:
    """``--entry MODULE_OR_FILE:build,step``."""

    target: str
    build: str
    step: str

    @property
    def is_file(self) -> bool:
        return self.target.endswith(".py") or os.sep in self.target or os.path.isfile(self.target)


@dataclass
class EntryPoints:
    build_fn: Callable[..., Any]
    step_fn: Callable[..., Any]
    files: list[str] = field(default_factory=list)
    # Classes and functions build_fn takes by keyword (a framework integration's build gets the
    # user's LightningModule class), imported under the same rules as build_fn.
    build_args: dict[str, Any] = field(default_factory=dict)


# replay's own framework integrations: their build/step functions are imported from the replay
# that runs (installed or not), never from a path the recording names.
_OWN_PREFIX = "replay.integrations."


def parse_entry_override(spec: str | None) -> EntryOverride | None:
    """Parse ``--entry MODULE_OR_FILE:build,step`` (``None``: none given); a malformed one is a
    one-line ``UsageError`` (exit 2)."""
    if spec is None:
        return None
    target, sep, names = spec.rpartition(":")
    parts = [p.strip() for p in names.split(",")]
    if not sep or not target or len(parts) != 2 or not all(parts):
        raise UsageError(
            f"--entry {spec!r}: expected MODULE_OR_FILE:build,step "
            "(e.g. train.py:build,train_step or mypkg.train:build,train_step)"
        )
    return EntryOverride(target, parts[0], parts[1])


def source_changed(path: str, sha256: str | None, recorded: str | None) -> str | None:
    """The warning that ``path`` no longer has the recorded ``sha256``, with a short diff from
    ``recorded`` (its text as recorded) when the recording kept it; ``None`` when it has, when
    no digest was recorded, or when the file cannot be read as text."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError):
        return None
    if not sha256 or hashlib.sha256(text.encode()).hexdigest() == sha256:
        return None
    msg = f"replay: warning: {path} changed since it was recorded (sha256 differs)"
    if recorded is not None:
        msg += "; replaying with the current code:\n" + _short_diff(recorded, text, path)
    return msg


def _short_diff(old: str, new: str, path: str) -> str:
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), f"{path} (recorded)", f"{path} (now)", lineterm=""
        )
    )
    if len(lines) > _DIFF_LINES:
        lines = lines[:_DIFF_LINES] + [f"... ({len(lines) - _DIFF_LINES} more diff lines)"]
    return "\n".join(lines)


class _Importer:
    """Imports each file or module once per process and reports what it imported."""

    def __init__(self, sources: dict[str, str], log: Callable[[str], None]) -> None:
        self.sources = sources
        self.log = log
        self.files: list[str] = []
        self._by_file: dict[str, ModuleType] = {}

    def _announce(self, path: str | None, recorded: dict[str, Any] | None) -> None:
        if path is None:
            return
        path = os.path.abspath(path)
        if path in self.files:
            return
        self.files.append(path)
        self.log(f"replay: importing {path}")
        if recorded is None:
            return
        msg = source_changed(
            path, recorded.get("sha256"), self.sources.get(recorded.get("path", ""))
        )
        if msg is not None:
            self.log(msg)
        elif recorded.get("path") and os.path.abspath(recorded["path"]) != path:
            self.log(f"replay: note: the recording used {recorded['path']}")

    def file(self, path: str, role: str, recorded: dict[str, Any] | None) -> ModuleType:
        path = os.path.abspath(path)
        if path in self._by_file:
            return self._by_file[path]
        if not os.path.isfile(path):
            raise EntryPointError(f"cannot import {role}: {path} does not exist; {_ENTRY_HINT}")
        # A private name: the script's `if __name__ == "__main__":` block must not run.
        digest = hashlib.sha1(path.encode()).hexdigest()[:8]
        stem = "".join(
            c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0]
        )
        name = f"_replay_user_{stem}_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise EntryPointError(
                f"cannot import {role} from {path}: not a Python file; {_ENTRY_HINT}"
            )
        module = importlib.util.module_from_spec(spec)
        directory = os.path.dirname(path)
        if directory not in sys.path[:1]:
            sys.path.insert(0, directory)  # its sibling imports resolve as they did when run
        sys.modules[name] = module
        self._announce(path, recorded)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's import failing: one line, exit 4
            sys.modules.pop(name, None)
            raise EntryPointError(
                f"cannot import {role} from {path}: importing it raised "
                f"{type(e).__name__}: {e}; {_ENTRY_HINT}"
            ) from None
        self._by_file[path] = module
        return module

    def module(
        self, name: str, role: str, recorded: dict[str, Any] | None, paths: list[str]
    ) -> ModuleType:
        for p in reversed([p for p in paths if p]):
            if p not in sys.path:
                sys.path.insert(0, p)
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise EntryPointError(
                f"cannot import {role}: module {name!r} is not importable ({e}); {_ENTRY_HINT}"
            ) from None
        except Exception as e:  # noqa: BLE001 - the user's import failing: one line, exit 4
            raise EntryPointError(
                f"cannot import {role}: importing module {name!r} raised {type(e).__name__}: {e}; "
                f"{_ENTRY_HINT}"
            ) from None
        self._announce(getattr(module, "__file__", None), recorded)
        return module


def _lookup(module: ModuleType, qualname: str, role: str, where: str) -> Callable[..., Any]:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise EntryPointError(
                f"cannot find {role} {qualname!r} in {where} (renamed or removed since the "
                f"recording?); {_ENTRY_HINT}"
            )
    if not callable(obj):
        raise EntryPointError(f"{role} {qualname!r} in {where} is not a function; {_ENTRY_HINT}")
    fn: Callable[..., Any] = obj
    return fn


@contextlib.contextmanager
def recorded_process(
    env: dict[str, Any],
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
    program: dict[str, Any] | None = None,
) -> Iterator[None]:
    """Import and build as the recorded process did: its ``sys.argv`` (a script that parses
    arguments at import time parses the recorded ones, not ``replay bisect run.h5``) and its
    working directory (relative paths in ``build_fn``). ``program``: the recorded program itself
    runs again (re-entry, reentry.py): ``sys.argv`` is at least its path, and ``sys.path[0]``
    what the interpreter made it. All are put back afterwards."""
    argv, cwd = env.get("argv"), env.get("cwd")
    saved_argv, saved_cwd, saved_path = list(sys.argv), os.getcwd(), list(sys.path)
    if isinstance(argv, list) and all(isinstance(a, str) for a in argv) and argv:
        sys.argv[:] = argv
    elif program is not None:
        sys.argv[:] = [str(program["path"])]
    if isinstance(cwd, str) and cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    elif cwd:
        log(f"replay: note: the recorded working directory {cwd} does not exist here")
    if program is not None:
        # As the interpreter sets it: the script's folder, or the working directory under -m.
        module = program.get("kind") == "module"
        here = cwd if isinstance(cwd, str) and cwd else os.getcwd()
        sys.path.insert(0, here if module else os.path.dirname(str(program["path"])))
    try:
        yield
    finally:
        sys.argv[:] = saved_argv
        if program is not None:
            sys.path[:] = saved_path
        os.chdir(saved_cwd)


def load_entry_points(
    entry: dict[str, Any],
    sources: dict[str, str],
    override: EntryOverride | None = None,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
) -> EntryPoints:
    """Import ``build_fn`` and ``step_fn`` as recorded (or as ``override`` says)."""
    imp = _Importer(sources, log)
    fns: dict[str, Callable[..., Any]] = {}
    roles = ["build_fn", "step_fn"] + [r for r in entry if r not in ("build_fn", "step_fn")]
    for role in roles:
        rec = entry.get(role)
        if override is not None and role not in ("build_fn", "step_fn"):
            # --entry: the user's file alone is imported, nothing else the recording names
            # (another entry file, the classes a framework integration's build takes).
            log(f"replay: note: --entry: not importing {role} from {_named(rec)}")
            continue
        if override is not None:
            qual = override.build if role == "build_fn" else override.step
            if override.is_file:
                mod = imp.file(override.target, role, rec)
                where = override.target
            else:
                mod = imp.module(override.target, role, rec, [os.getcwd()])
                where = f"module {override.target}"
            fns[role] = _lookup(mod, qual, role, where)
            continue
        if not isinstance(rec, dict):
            raise EntryPointError(f"the recording names no {role}; {_ENTRY_HINT}")
        if str(rec.get("module", "")).startswith(_OWN_PREFIX):
            fns[role] = _own(rec, role)
            continue
        path = _user_file(rec, role)
        if rec.get("is_script") or rec.get("module") == "__main__":
            mod = imp.file(path, role, rec)
            where = path
        else:
            name = str(rec.get("module"))
            mod = imp.module(name, role, rec, [_project_root(name, path, role)])
            got = getattr(mod, "__file__", None)
            if not got or os.path.realpath(got) != os.path.realpath(path):
                raise EntryPointError(
                    f"cannot import {role}: module {name!r} resolves to {got}, not the recorded "
                    f"{path}; {_ENTRY_HINT}"
                )
            where = f"module {name}"
        fn = _lookup(mod, str(rec.get("qualname")), role, where)
        _defined_in(fn, path, role)
        fns[role] = fn
    args = {r: f for r, f in fns.items() if r not in ("build_fn", "step_fn")}
    return EntryPoints(fns["build_fn"], fns["step_fn"], imp.files, args)


def _named(rec: Any) -> str:
    """Where a recorded entry says its code is, for a note (escaped: the file's words)."""
    if not isinstance(rec, dict):
        return "the recording"
    return ascii(str(rec.get("path") or rec.get("module") or "the recording"))


def _own(rec: dict[str, Any], role: str) -> Callable[..., Any]:
    """An entry point of replay's own integrations, from the replay that runs."""
    name = str(rec.get("module"))
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise EntryPointError(
            f"cannot import {role}: {name} needs its framework installed ({e}); "
            "pip install torch-replay[lightning] or [transformers]"
        ) from None
    fn = _lookup(module, str(rec.get("qualname")), role, f"module {name}")
    if getattr(fn, "__module__", None) != name:
        raise EntryPointError(f"{role} {rec.get('qualname')!r} is not defined in {name}")
    return fn


def _user_file(rec: dict[str, Any], role: str) -> str:
    """The recorded entry point's file, if it may be imported: a ``.py`` file of the user's own
    (not of the standard library or an installed package, whatever the recording says)."""
    path = rec.get("path")
    if not isinstance(path, str) or not path.endswith(".py"):
        raise EntryPointError(
            f"the recording names {role} in {path!r}, not a Python source file; {_ENTRY_HINT}"
        )
    if installed(path):
        raise EntryPointError(
            f"refusing to import {role} from {path}: it belongs to the standard library or "
            "an installed package, and an entry point must be the recorded script or a "
            f"module of your own project; {_ENTRY_HINT}"
        )
    return path


def _project_root(module: str, path: str, role: str) -> str:
    """The directory that makes ``module`` importable as ``path``: derived from the file the
    recording names, never taken from its working directory."""
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        raise EntryPointError(f"the recording names {role} in module {module!r}; {_ENTRY_HINT}")
    base = os.path.splitext(os.path.abspath(path))[0]
    if os.path.basename(base) == "__init__":
        base = os.path.dirname(base)
    tail = os.path.join(*parts)
    if not base.endswith(os.sep + tail):
        raise EntryPointError(
            f"the recording names {role} in module {module!r} at {path}, which does not match "
            f"its name; {_ENTRY_HINT}"
        )
    return base[: -len(tail) - 1] or os.sep


def _defined_in(fn: Callable[..., Any], path: str, role: str) -> None:
    """The function (or class) found must be one written in the recorded file (``os.abort``
    re-exported under the recorded name is not)."""
    if isinstance(fn, type):
        try:
            where = inspect.getsourcefile(fn)
        except TypeError:
            where = None
    else:
        code = getattr(inspect.unwrap(fn), "__code__", None)
        where = code.co_filename if code is not None else None
    if where is None or os.path.realpath(where) != os.path.realpath(path):
        raise EntryPointError(
            f"{role} {getattr(fn, '__qualname__', fn)!r} is not a function defined in {path}; "
            f"refusing to call it. {_ENTRY_HINT}"
        )

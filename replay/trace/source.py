"""User source locations: which frames are "user code", interned locations and stacks, and the
text of the referenced lines (read with ``linecache`` at trace time, so the TUI never opens the
user's files)."""

from __future__ import annotations

import hashlib
import json
import linecache
import os
import sys
import sysconfig
from types import CodeType, FrameType, TracebackType
from typing import TypedDict

import torch

from replay.reports.verdict import SourceLine

__all__ = [
    "Interner",
    "Locations",
    "SourceFile",
    "is_user_file",
    "snapshot_sources",
]

CONTEXT_LINES = 3
MAX_STACK = 16

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_REPLAY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = sysconfig.get_paths()["stdlib"]
_STDLIB_DIRS = tuple({os.path.realpath(_STDLIB) + os.sep, _STDLIB + os.sep})
_SKIP_PREFIXES = (_TORCH_DIR, _REPLAY_DIR, *_STDLIB_DIRS)
_SKIP_PARTS = (os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep)


def is_user_file(filename: str) -> bool:
    """Not torch, not replay, not the standard library, not a ``<frozen ...>`` pseudo-file."""
    if filename.startswith("<") or filename.startswith(_SKIP_PREFIXES):
        return False
    return not any(p in filename for p in _SKIP_PARTS)


class SourceFile(TypedDict):
    """A referenced file in the sidecar's ``/sources``: its sha256 (None when it cannot be read)
    and the lines kept, by line number (a string: JSON keys)."""

    sha256: str | None
    lines: dict[str, str]


class Interner:
    """Strings to dense indices, first come first numbered."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.items: list[str] = []

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.items)
            self.items.append(s)
        return i


class Locations:
    """Interns ``file:line:function`` locations and JSON stacks of them (innermost last)."""

    def __init__(self) -> None:
        self.locations = Interner()
        self.stacks = Interner()
        self._user: dict[CodeType, bool] = {}
        self._loc_key: dict[tuple[str, int, str], int] = {}
        self._stack_key: dict[tuple[int, ...], int] = {}
        # The frame that called into the traced step (set while tracing): it and the frames
        # outside it are the caller's, not the step's, whatever files they are in.
        self.outer: FrameType | None = None

    def _is_user(self, code: CodeType) -> bool:
        u = self._user.get(code)
        if u is None:
            u = self._user[code] = is_user_file(code.co_filename)
        return u

    def _loc(self, filename: str, line: int, func: str) -> int:
        key = (filename, line, func)
        i = self._loc_key.get(key)
        if i is None:
            i = self._loc_key[key] = self.locations(f"{filename}:{line}:{func}")
        return i

    def _site(self, locs: list[int]) -> tuple[int, int]:
        """``(location, stack)`` of the innermost of ``locs`` (outermost first), or ``(-1, -1)``."""
        if not locs:
            return -1, -1
        key = tuple(locs)
        i = self._stack_key.get(key)
        if i is None:
            i = self._stack_key[key] = self.stacks(json.dumps(locs))
        return locs[-1], i

    def here(self, frame: FrameType | None = None, *, ran: bool = False) -> tuple[int, int]:
        """``(location, stack)`` indices of the calling user code; ``(-1, -1)`` if none.

        ``ran``: where an op ran, the walk stopping at the autograd engine's entry, so that a
        backward op run by autograd's own formulas has none (on the CPU the engine runs on the
        thread that called ``backward()``, whose line says nothing of the op; on CUDA it runs
        on a thread of its own) and one a custom ``Function.backward`` ran has that line."""
        f: FrameType | None = frame if frame is not None else sys._getframe(1)
        locs: list[int] = []
        while f is not None and f is not self.outer and len(locs) < MAX_STACK:
            code = f.f_code
            if ran and code.co_name == "_engine_run_backward":  # (torch/autograd/graph.py)
                break
            if self._is_user(code):
                locs.append(self._loc(code.co_filename, f.f_lineno, code.co_name))
            f = f.f_back
        return self._site(locs[::-1])

    def user_frame(self, frame: FrameType | None) -> FrameType | None:
        """The innermost user frame at or outside ``frame`` (inside the traced step), or None."""
        while frame is not None and frame is not self.outer:
            if self._is_user(frame.f_code):
                return frame
            frame = frame.f_back
        return None

    def from_traceback(self, tb: TracebackType | None) -> tuple[int, int]:
        """The innermost user frame of a traceback (where a Python-level error was raised)."""
        locs: list[int] = []
        while tb is not None:
            code = tb.tb_frame.f_code
            if self._is_user(code):
                locs.append(self._loc(code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
        return self._site(locs[-MAX_STACK:])

    def describe(self, index: int) -> SourceLine | None:
        """``{"file", "line", "function", "code"}`` for a location index."""
        if index < 0:
            return None
        filename, line, func = self.locations.items[index].rsplit(":", 2)
        code = linecache.getline(filename, int(line)).strip()
        return {"file": filename, "line": int(line), "function": func, "code": code}


def snapshot_sources(locations: list[str]) -> dict[str, SourceFile]:
    """The referenced lines, with ``CONTEXT_LINES`` of context, per file, plus the file's sha256."""
    wanted: dict[str, set[int]] = {}
    for loc in locations:
        filename, line, _ = loc.rsplit(":", 2)
        n = int(line)
        wanted.setdefault(filename, set()).update(
            range(max(1, n - CONTEXT_LINES), n + CONTEXT_LINES + 1)
        )
    out: dict[str, SourceFile] = {}
    for filename, lines in wanted.items():
        try:
            with open(filename, "rb") as fh:
                digest: str | None = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            digest = None
        got = ((n, linecache.getline(filename, n)) for n in sorted(lines))
        text = {str(n): s.rstrip("\n") for n, s in got if s}
        out[filename] = {"sha256": digest, "lines": text}
    return out

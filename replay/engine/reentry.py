"""Replay by re-entry: run the recorded program again, in this process, up to its Recorder.

The program is run as ``__main__`` (its script with ``runpy.run_path``, or its ``-m`` module)
with the recorded ``sys.argv``, working directory and ``sys.path[0]``. It builds its model,
optimizer, data and framework objects exactly as it did when it trained; its first
``replay.Recorder`` (or framework callback) hands them to ``on_takeover`` and then unwinds the
program with ``ReplayFinished`` before any training (``replay/capture/guard.py``). What the
program does before its Recorder runs again (docs/reentry.md); what it does after does not.

``on_takeover`` runs deep inside the user's stack (inside ``trainer.fit()`` for a framework):
its result, or the exception it raised, is carried out past the user's code, which never sees
it (a program's ``except Exception`` around its loop cannot swallow a replay error).
"""

from __future__ import annotations

import os
import runpy
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..capture.guard import LiveProgram, ReplayFinished, reentering
from ..errors import EntryPointError, first_line
from .entry import recorded_process, source_changed
from .foreign import command_of
from .hands_off import TouchedError, active_guard

__all__ = ["run_program", "program_of"]

T = TypeVar("T")


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.value: T | None = None
        self.error: BaseException | None = None
        self.done = False


def program_of(meta: dict[str, Any], path: str) -> dict[str, Any]:
    """The recorded program to run again, or a one-line ``EntryPointError`` saying why none."""
    program = meta.get("program")
    if not isinstance(program, dict) or not isinstance(program.get("path"), str):
        why = meta.get("not_replayable")
        raise EntryPointError(
            f"{path} records no program to run again"
            + (f" ({why})" if why else " (recorded by an older replay)")
            + "; record with build_fn= to replay through entry points, or pass --entry"
        )
    return program


def _kept_from(e: BaseException) -> str | None:
    """What the program was kept from doing, when that is why it stopped (hands_off.py)."""
    guard = active_guard()
    if not isinstance(e, OSError) or guard is None or not guard.refused:
        return None
    touched = any(isinstance(c, TouchedError) for c in (e, e.__cause__, e.__context__))
    return guard.refused[-1] if touched else None


def _changed_since_the_run(env: dict[str, Any]) -> str:
    """What the re-run read before its Recorder that the run changed after it began, as a
    clause of the error (empty when nothing): a program that resumes from its own checkpoint at
    start-up reads the one written since, and its resume code may fail on it."""
    guard, began = active_guard(), env.get("started")
    if guard is None or not isinstance(began, (int, float)):
        return ""
    changed = guard.read_since(float(began))
    if not changed:
        return ""
    cwd = env.get("cwd") if isinstance(env.get("cwd"), str) else os.getcwd()
    shown = []
    for path, mtime in changed[:3]:
        rel = os.path.relpath(path, cwd)
        name = path if rel.startswith("..") else rel
        shown.append(
            f"{name} (changed {_span(max(0.0, mtime - float(began)))} after the run began)"
        )
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return (
        f". Before that it read {', '.join(shown)}{more}: files the run wrote while it "
        "trained, which a program that resumes from its own checkpoint at start-up now resumes "
        "from; put that resume under `if not replay.replaying():` (docs/reentry.md)"
    )


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def run_program(
    meta: dict[str, Any],
    env: dict[str, Any],
    sources: dict[str, str],
    on_takeover: Callable[[LiveProgram], T],
    *,
    recording: str,
    log: Callable[[str], None],
) -> T:
    """Run the recorded program until its first Recorder, call ``on_takeover`` with what it
    handed over, end the program, and return what ``on_takeover`` returned (or raise what it
    raised). A program that ends, exits or raises before its Recorder is an ``EntryPointError``
    (exit 4) that says so."""
    program = program_of(meta, recording)
    path = str(program["path"])
    if not os.path.isfile(path):
        raise EntryPointError(
            f"cannot run the recorded program: {path} does not exist here; pass --entry, or "
            "replay where it was recorded"
        )
    msg = source_changed(path, program.get("sha256"), sources.get(path))
    if msg is not None:
        log(msg)
    log(f"replay: running {command_of(program, env)} again, up to its replay.Recorder")
    out: _Outcome[T] = _Outcome()

    def taken(live: LiveProgram) -> None:
        try:
            out.value = on_takeover(live)
        except BaseException as e:  # noqa: BLE001 - carried out past the user's code, re-raised below
            out.error = e
        out.done = True

    ended: str | None = None
    kept: str | None = None
    with recorded_process(env, log, program), reentering(taken):
        try:
            if program.get("kind") == "module":
                runpy.run_module(str(program["module"]), run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(path, run_name="__main__")
        except ReplayFinished:
            pass
        except SystemExit as e:
            ended = f"exited (code {e.code!r})"
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - the user's program failing: one line, exit 4
            ended = f"raised {type(e).__name__}: {first_line(e)[:300]}"
            kept = _kept_from(e)
        else:
            ended = "ran to its end"
    if out.error is not None:
        raise out.error
    if not out.done and kept is not None:
        raise EntryPointError(
            f"the recorded program {command_of(program, env)} was stopped before its "
            f"Recorder: {kept}; a replay changes no file of yours and connects nowhere, so put "
            "that under `if not replay.replaying():` (docs/reentry.md)"
        )
    if not out.done:
        raise EntryPointError(
            f"the recorded program {command_of(program, env)} {ended} before it "
            "constructed a replay.Recorder; replay takes over at the program's first Recorder "
            "(or framework callback), so it must construct one as it did when it recorded"
            + _changed_since_the_run(env)
        )
    return out.value  # type: ignore[return-value]

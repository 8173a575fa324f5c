"""Another ``replay`` command in a child process: the one way replay's own code runs one
(``preflight`` verifies and bisects the run it recorded; the TUI traces a step and tries a change
without importing torch or running user code itself).

The child is ``python -m replay VERB ARGS`` in its own process group, stdin closed, its output
captured as text; at ``timeout`` the whole group is killed (its recorder's writer and DataLoader
workers with it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ChildRun", "start_group", "end_group", "run_replay"]


@dataclass(frozen=True)
class ChildRun:
    code: int  # the exit code; -1 when it was killed at the timeout
    stdout: str
    stderr: str

    def error_line(self) -> str:
        """What went wrong in one line: the last line of stderr, or the exit code."""
        return (self.stderr.strip().splitlines() or [f"exit {self.code}"])[-1]


def start_group(
    cmd: list[str], env: Mapping[str, str] | None, *, stderr: int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """``cmd`` as the leader of a new process group (session), stdin closed, stdout piped as
    text (``stderr``: piped too, or ``subprocess.STDOUT`` to merge it)."""
    return subprocess.Popen(
        cmd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        errors="replace",
        start_new_session=True,
    )


def end_group(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc``'s whole process group (it was started as its own session): the run's
    forked children, its recorder's writer and DataLoader workers go with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_replay(
    verb: str, *args: str, timeout: float | None = None, env: Mapping[str, str] | None = None
) -> ChildRun:
    """``replay VERB ARGS`` in a fresh process group (``env``: its environment, this one's by
    default), killed whole at ``timeout`` seconds."""
    proc = start_group([sys.executable, "-m", "replay", verb, *args], env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_group(proc)
        proc.communicate()
        return ChildRun(-1, "", f"replay: error: replay {verb} did not finish in {timeout:g} s")
    finally:
        if proc.poll() is None:
            end_group(proc)
    return ChildRun(proc.returncode, stdout, stderr)

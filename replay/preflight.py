"""``replay preflight``: before a nine-hour job, check that its steps replay bitwise.

Runs the user's own command for a few steps with recording into a temporary file (the first
``Recorder`` of that process takes its path and step count from ``REPLAY_PREFLIGHT`` and ends
the run cleanly once they are recorded), then replays them with ``replay verify`` in a fresh
process, as ``replay bisect`` would after a crash, and says whether the run is replayable and,
if not, why and what to change. No torch here: both halves run in child processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .capture.guard import PREFLIGHT_ENV

__all__ = ["PreflightReport", "run_preflight"]

_TAIL = 12  # lines of the run's own output kept for a report


@dataclass
class PreflightReport:
    command: list[str]
    steps: int
    replayable: bool = False
    reason: str = ""  # why not, in a sentence: the cause kind or what went wrong first
    run_exit: int | None = None
    run_seconds: float = 0.0
    run_tail: list[str] = field(default_factory=list)
    recording: str | None = None
    verify: dict[str, Any] | None = None  # ``replay verify --json``'s output
    verify_exit: int | None = None
    verify_error: str | None = None
    kept: str | None = None  # where the recording was kept (--keep)

    def json(self) -> dict[str, Any]:
        return {
            "replayable": self.replayable,
            "reason": self.reason,
            "command": self.command,
            "steps": self.steps,
            "run_exit": self.run_exit,
            "run_seconds": round(self.run_seconds, 3),
            "verify_exit": self.verify_exit,
            "verify_error": self.verify_error,
            "cause": (self.verify or {}).get("cause"),
            "first_divergence": (self.verify or {}).get("first_divergence"),
            "replayed_steps": (self.verify or {}).get("replayed_steps"),
            "recording": self.kept,
        }


def _run_streaming(
    cmd: list[str], env: dict[str, str], timeout: float | None, echo: Callable[[str], None]
) -> tuple[int, list[str]]:
    """Run ``cmd``, passing its output on line by line (to our stderr); keep the last lines."""
    tail: list[str] = []
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    deadline = None if timeout is None else time.monotonic() + timeout
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            echo(line.rstrip("\n"))
            tail.append(line.rstrip("\n"))
            del tail[:-_TAIL]
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                tail.append(f"(replay preflight: stopped the run after {timeout:g} s)")
                break
        return proc.wait(), tail
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_preflight(
    command: list[str],
    *,
    steps: int = 8,
    keep: str | None = None,
    timeout: float | None = None,
    echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> PreflightReport:
    """Record ``steps`` steps of ``command`` and replay them in a fresh process."""
    rep = PreflightReport(list(command), steps)
    with tempfile.TemporaryDirectory(prefix="replay-preflight-") as tmp:
        path = os.path.abspath(keep) if keep else os.path.join(tmp, "preflight.h5")
        env = dict(os.environ)
        env[PREFLIGHT_ENV] = json.dumps({"path": path, "steps": steps})
        t0 = time.perf_counter()
        try:
            rep.run_exit, rep.run_tail = _run_streaming(command, env, timeout, echo)
        except OSError as e:
            rep.reason = f"the command could not start: {e.strerror or e}"
            return rep
        rep.run_seconds = time.perf_counter() - t0
        if not os.path.exists(path):
            rep.reason = (
                "the command created no replay.Recorder (or died before its first step)"
                if rep.run_exit == 0
                else f"the command exited with {rep.run_exit} before recording a step"
            )
            return rep
        rep.recording = path
        rep.kept = path if keep else None
        if rep.run_exit not in (0, None):
            rep.reason = f"the command exited with {rep.run_exit} while recording"
            # its steps may still replay: verify says more than the exit code alone
        proc = subprocess.run(
            [sys.executable, "-m", "replay", "verify", path, "--json"],
            env={k: v for k, v in os.environ.items() if k != PREFLIGHT_ENV},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
        rep.verify_exit = proc.returncode
        if proc.returncode in (0, 1):
            try:
                rep.verify = json.loads(proc.stdout)
            except ValueError:
                rep.verify_error = "replay verify printed no JSON"
        else:
            errs = [ln for ln in proc.stderr.splitlines() if ln.startswith("replay: error:")]
            rep.verify_error = (
                errs[-1].removeprefix("replay: error: ")
                if errs
                else (proc.stderr.strip().splitlines() or ["no output"])[-1]
            )
    if rep.verify is not None and rep.verify.get("deterministic") and rep.run_exit == 0:
        rep.replayable = True
        rep.reason = "every replayed step matches the recording bitwise"
    elif rep.verify is not None and not rep.verify.get("deterministic"):
        cause = rep.verify.get("cause") or {}
        rep.reason = cause.get("kind") or "the replay differs from the recording"
    elif rep.verify_error is not None:
        rep.reason = rep.verify_error
    return rep

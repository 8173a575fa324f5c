"""Shared fixtures: real training scripts run in real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# No background self-check (docs/selfcheck.md) in the runs the suite records, in this process
# and its children: each would replay its run once more. tests/selfcheck turns it on.
os.environ["REPLAY_SELF_CHECK"] = "0"
SCRIPTS = Path(__file__).resolve().parent / "integration" / "scripts"


def run_env() -> dict[str, str]:
    """The environment of a child Python: this checkout importable, one torch thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_py(
    *args: str,
    timeout: float = 120,
    env: dict | None = None,
    check: bool = False,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python args...`` with this checkout importable; capture text output."""
    full_env = run_env()
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def replay_cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return run_py("-m", "replay", *args, timeout=timeout, **kw)


def replay_json(*args: str, **kw) -> tuple[int, dict, str]:
    """``replay ARGS --json``: the exit code, the report it printed ({} for none), stderr."""
    p = replay_cli(*args, "--json", **kw)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


@pytest.fixture(scope="session")
def mlp_script() -> Path:
    return SCRIPTS / "mlp_train.py"

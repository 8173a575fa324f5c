"""Helpers for the bisect/replay integration tests: record a run of train_tiny.py in a
subprocess (so its entry points are a real ``__main__`` script) and call the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.conftest import replay_cli, run_py

SCRIPT = Path(__file__).with_name("train_tiny.py")


def write_script(directory: Path, config: dict | None = None, name: str = "train.py") -> Path:
    text = SCRIPT.read_text()
    if config is not None:
        text = re.sub(r"^CONFIG = .*$", f"CONFIG = {config!r}", text, count=1, flags=re.M)
    path = directory / name
    path.write_text(text)
    return path


def record(
    directory: Path,
    mode: str,
    at: int = -1,
    *,
    steps: int = 30,
    every: int = 10,
    config: dict | None = None,
) -> tuple[Path, dict]:
    """Record a run; returns (recording path, the truth the script computed on its own)."""
    script = write_script(directory, config)
    run, truth = directory / "run.h5", directory / "truth.json"
    run_py(
        str(script),
        str(run),
        "--mode",
        mode,
        "--at",
        str(at),
        "--steps",
        str(steps),
        "--snapshot-every",
        str(every),
        "--truth",
        str(truth),
        timeout=120,
        cwd=directory,
    )
    assert run.exists(), f"recording {mode} failed"
    return run, json.loads(truth.read_text())


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return replay_cli(*args, timeout=180, cwd=cwd)


def cli_json(*args: str) -> tuple[int, dict | None, str]:
    p = cli(*args, "--json")
    data = json.loads(p.stdout) if p.stdout.strip().startswith("{") else None
    return p.returncode, data, p.stderr

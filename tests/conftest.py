"""Shared fixtures: real training scripts run in real subprocesses, and the one way the suite
launches a child Python (``run_env``/``run_py``) or runs a ``replay`` command in this process
(``replay_here``).

The folders of importable test programs (``integration/scripts``, ``integration``) are on
``sys.path`` through ``pythonpath`` in pyproject.toml, not a ``sys.path.insert`` per file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# No background self-check (docs/selfcheck.md) in the runs the suite records, in this process
# and its children: each would replay its run once more. tests/selfcheck turns it on.
os.environ["REPLAY_SELF_CHECK"] = "0"
SCRIPTS = Path(__file__).resolve().parent / "integration" / "scripts"


def run_env(*paths: str | os.PathLike[str]) -> dict[str, str]:
    """The environment of a child Python: this checkout (and ``paths``, first) importable, one
    torch thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_py(
    *args: str,
    timeout: float = 120,
    env: dict | None = None,
    check: bool = False,
    cwd: str | os.PathLike | None = None,
    input: str | None = None,
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
        input=input,
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


class HangError(Exception):
    """A command run by ``replay_here`` did not finish in time (it opened a FIFO?)."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise ``HangError`` in this (main) thread after ``seconds``; a blocking ``open`` of a
    FIFO returns with EINTR, so a command that follows a link to one fails instead of hanging."""

    def _alarm(signum: int, frame: object) -> None:
        raise HangError(f"still running after {seconds} s")

    if threading.current_thread() is not threading.main_thread():  # no signals there
        yield
        return
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def replay_here(*args: str, timeout: float = 60, text: bool = True) -> subprocess.CompletedProcess:
    """``replay ARGS`` run in this process by the console entry point (``replay.cli.main``)
    under click's ``CliRunner`` isolation: the exit code, stdout and stderr as a child would
    give them (``text=False``: bytes), without a child's ~1-2 s of imports.

    For the commands that import no torch and run no user code (``info``, ``doctor``, usage
    errors, errors before a replay starts). Warnings print to stderr as in a child, not raised
    as the suite's ``filterwarnings = error`` would; ``REPLAY_TRACEBACK`` is unset, as in
    ``run_py``'s children.
    """
    from click.testing import CliRunner

    from replay.cli import main

    code: int = 0
    with (
        CliRunner().isolation(env={"REPLAY_TRACEBACK": None}) as (out, err, _),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("default")
        try:
            with _deadline(timeout):
                main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        sys.stdout.flush()
        sys.stderr.flush()
        stdout, stderr = out.getvalue(), err.getvalue()
    if text:
        return subprocess.CompletedProcess(
            ["replay", *args],
            code,
            stdout.decode("utf-8", "replace"),
            stderr.decode("utf-8", "replace"),
        )
    return subprocess.CompletedProcess(["replay", *args], code, stdout, stderr)


def replay_here_json(*args: str, **kw) -> tuple[int, dict, str]:
    """``replay_json`` in this process (see ``replay_here``)."""
    p = replay_here(*args, "--json", **kw)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


@pytest.fixture(scope="session")
def mlp_script() -> Path:
    return SCRIPTS / "mlp_train.py"


@pytest.fixture(scope="session")
def mlp_nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 steps of the test MLP (snapshots at 0, 10, 20), the loss NaN at step 22, where it
    stopped: for tests that only read it (copy it before changing it). The dense ring alone
    (reach 0): info's truncation tests cut the file where its health rows still lie before
    the cut."""
    out = tmp_path_factory.mktemp("mlp-nan") / "run.h5"
    proc = run_py(
        str(SCRIPTS / "mlp_train.py"), str(out), "--steps", "30", "--nan-at", "22", "--reach", "0"
    )
    assert out.exists() and "NonFiniteLossError" in proc.stderr, proc.stderr[-2000:]
    return out


RANK_NAN_STEP = 12  # rank 1's batch gets a NaN here; rank 0 trains on


@pytest.fixture(scope="session")
def rank_set(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``ddp/run.h5``: the base path of ``run.rank0.h5`` (20 clean steps) and ``run.rank1.h5``
    (NaN loss at step 12, where it stops), two real training processes run side by side."""
    d = tmp_path_factory.mktemp("tui-ranks", numbered=False) / "ddp"
    d.mkdir()
    base = str(d / "run.h5")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).parent / "tui" / "rank_fixture.py"),
                str(r),
                base,
                "--steps",
                "20",
            ]
            + (["--nan-at", str(RANK_NAN_STEP)] if r == 1 else []),
            env=run_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for r in (0, 1)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    return base

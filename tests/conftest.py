"""Shared fixtures: real training scripts run in real subprocesses, and the one way the suite
launches a child Python (``run_env``/``run_py``) or runs a ``replay`` command in this process
(``replay_here``).

The folders of importable test programs (``integration/scripts``, ``integration``) are on
``sys.path`` through ``pythonpath`` in pyproject.toml, not a ``sys.path.insert`` per file.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# No background self-check (docs/selfcheck.md) in the runs the suite records, in this process
# and its children: each would replay its run once more. tests/selfcheck turns it on.
os.environ["REPLAY_SELF_CHECK"] = "0"
# One key for every process of the suite (docs/trust.md): the recordings its children make are
# signed with it and verify in the children that replay them, without --trust; a user's own key
# and trust store (~/.local/share/replay) are never touched. Per user, made 0700 by replay.
os.environ.setdefault(
    "REPLAY_HOME",
    os.path.join(
        tempfile.gettempdir(), f"replay-tests-{os.getuid() if hasattr(os, 'getuid') else 0}"
    ),
)
SCRIPTS = Path(__file__).resolve().parent / "integration" / "scripts"


#: every test this session collected, before ``-m`` deselected any (tests/unit/test_tiers.py)
COLLECTED: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the matrix cases (tests/tiers.py): `make test` leaves them to `make test-all`."""
    from tests.tiers import tier

    COLLECTED[:] = [item.nodeid for item in items]
    for item in items:
        if tier(item.nodeid) is not None:
            item.add_marker(pytest.mark.matrix)


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
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``python args...`` with this checkout importable; capture text output.

    ``python script.py ...``, ``-m module ...`` and ``-c code ...`` are forked from this worker's
    fork server (``tests/forkserver.py``: torch imported once) unless ``fresh``: a fresh
    interpreter, for what must see one (which modules a command imports).
    ``REPLAY_TEST_FORKSERVER=0`` in the environment turns the server off."""
    full_env = run_env()
    if env:
        full_env.update(env)
    if not fresh and (
        server := _fork_server("replay" if args[:2] == ("-m", "replay") else "program")
    ):
        ran = server.run(list(args), full_env, cwd, input, timeout)
        if ran is not None:
            if check and ran.returncode != 0:
                raise AssertionError(
                    f"exit {ran.returncode}\nstdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"
                )
            return ran
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


class _ForkServer:
    """The client of ``tests/forkserver.py``. A test process has two, started on first use:
    one forks the programs that record, the other the ``replay`` commands, each with its own
    hash seed, so that a recording is replayed under another one, as in real use (a forked
    child keeps its server's: a set of strings iterates in the same order in all of them).

    A child's stdout and stderr are FIFOs read until every process holding them closed them,
    as ``subprocess.run`` reads its pipes: a self-check the run started still writes its
    warning there after the run ended."""

    def __init__(self) -> None:
        env = run_env()
        for k in ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG"):
            env.pop(k, None)  # the server measures nothing; each child starts its own
        env["PYTHONHASHSEED"] = str(int.from_bytes(os.urandom(4), "little"))
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("forkserver.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.pending = b""
        self.lock = threading.Lock()
        self.dir = Path(tempfile.mkdtemp(prefix="replay-forks-"))
        atexit.register(shutil.rmtree, self.dir, True)
        ready = self._message(time.monotonic() + 120)
        if ready is None or "ready" not in ready:
            raise RuntimeError("the fork server did not start")

    def _message(self, deadline: float) -> dict | None:
        """The server's next message, or None at the deadline."""
        import select

        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:
                raise RuntimeError("the fork server ended")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)

    def run(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: str | os.PathLike | None,
        input: str | None,
        timeout: float,
    ) -> subprocess.CompletedProcess | None:
        """``python args...`` forked from the server; None when it cannot take it (busy, not
        a script, ``-m`` or ``-c``), and the caller starts a fresh interpreter."""
        if not args or not (args[0] in ("-m", "-c") or args[0].endswith(".py")):
            return None
        if not self.lock.acquire(blocking=False):
            return None
        try:
            return self._run(args, env, os.fspath(cwd or os.getcwd()), input or "", timeout)
        finally:
            self.lock.release()

    def _run(
        self, args: list[str], env: dict[str, str], cwd: str, input: str, timeout: float
    ) -> subprocess.CompletedProcess:
        import select

        stdin = self.dir / "stdin"
        stdin.write_text(input)
        fifos = {k: self.dir / k for k in ("stdout", "stderr")}
        for f in fifos.values():
            f.unlink(missing_ok=True)
            os.mkfifo(f)
        reads = {k: os.open(f, os.O_RDONLY | os.O_NONBLOCK) for k, f in fifos.items()}
        # held open for writing until the child ended: no EOF before it opened its own ends
        holds = [os.open(f, os.O_WRONLY | os.O_NONBLOCK) for f in fifos.values()]
        out = {k: bytearray() for k in fifos}
        req = {
            "argv": args,
            "env": env,
            "cwd": cwd,
            "stdin": str(stdin),
            **{k: str(f) for k, f in fifos.items()},
        }
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        pid: int | None = None
        status: int | None = None
        timed_out = False
        try:
            while reads or status is None:
                if status is None and b"\n" in self.pending:
                    msg = self._message(deadline)
                    assert msg is not None
                    if "pid" in msg:
                        pid = msg["pid"]
                    else:
                        status = msg["status"]
                        for h in holds:
                            os.close(h)
                        holds = []
                    continue
                left = deadline - time.monotonic()
                if left <= 0 and not timed_out and pid is not None:
                    timed_out = True  # as subprocess.run: kill it and what it started
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    deadline = time.monotonic() + 60
                    continue
                if left <= 0:
                    raise RuntimeError("the fork server did not answer")
                watch = list(reads.values()) + ([self.fd] if status is None else [])
                ready = select.select(watch, [], [], left)[0]
                for fd in ready:
                    if fd == self.fd:
                        chunk = os.read(self.fd, 4096)
                        if not chunk:
                            raise RuntimeError("the fork server ended")
                        self.pending += chunk
                        continue
                    key = next(k for k, v in reads.items() if v == fd)
                    data = os.read(fd, 65536)
                    if data:
                        out[key] += data
                    else:
                        os.close(fd)
                        del reads[key]
        finally:
            for fd in [*reads.values(), *holds]:
                os.close(fd)
        stdout, stderr = _text(bytes(out["stdout"])), _text(bytes(out["stderr"]))
        if timed_out:
            raise subprocess.TimeoutExpired([sys.executable, *args], timeout, stdout, stderr)
        assert status is not None
        return subprocess.CompletedProcess(
            [sys.executable, *args], os.waitstatus_to_exitcode(status), stdout, stderr
        )


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes: universal newlines (a progress line's ``\\r``)."""
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


_SERVERS: dict[str, _ForkServer | None] = {}


def _fork_server(role: str) -> _ForkServer | None:
    """This process's fork server for ``role`` ("program" or "replay"); None when the servers
    are off or it could not start."""
    if os.environ.get("REPLAY_TEST_FORKSERVER", "1") == "0":
        return None
    server = _SERVERS.get(role)
    if server is not None and server.proc.poll() is not None:
        del _SERVERS[role]  # it died: start another
    if role not in _SERVERS:
        try:
            _SERVERS[role] = _ForkServer()
        except (OSError, RuntimeError):
            _SERVERS[role] = None
    return _SERVERS[role]


# A run that keeps its process until its self-check has said its word, as a long run would: the
# check ends with the training process (docs/selfcheck.md), and its line reaches stderr through
# that process. The program runs as __main__, as `python script.py` would run it.
_UNTIL_CHECKED = """
import glob, json, os, runpy, sys, time
script = sys.argv.pop(1)
sys.argv[0] = script
sys.path[0] = os.path.dirname(os.path.abspath(script))

def checking():
    for path in glob.glob("*.selfcheck.json"):
        try:
            with open(path) as fh:
                pid = json.load(fh).get("pid")
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[-1].split()[0] != "Z":
                    return True
        except (OSError, ValueError, TypeError, AttributeError, IndexError):
            pass
    return False

try:
    runpy.run_path(script, run_name="__main__")
finally:
    deadline = time.monotonic() + 150
    time.sleep(0.5)
    while checking() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.2)  # the training's thread copies the check's last line
"""


def run_until_checked(script: str, *args: str, **kw) -> subprocess.CompletedProcess:
    """``python script ARGS`` with the self-check on, its process kept until the check ends."""
    env = {**kw.pop("env", {}), "REPLAY_SELF_CHECK": "1"}
    return run_py("-c", _UNTIL_CHECKED, script, *args, env=env, **kw)


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

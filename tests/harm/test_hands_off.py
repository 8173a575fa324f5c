"""Do no harm (docs/reentry.md, "What a re-run may not touch"; docs/selfcheck.md): replay runs
the user's program again, in the background while it trains and in every replaying command,
and that second run changes no file that existed before it, connects nowhere and leaves nothing
behind. Real programs, real recordings, real child processes; every file compared byte for
byte."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from replay.store.selfcheck import SelfCheck, read_selfcheck, write_selfcheck
from tests.conftest import replay_cli, replay_here_json, run_env, run_py

PROGRAMS = Path(__file__).with_name("programs")


def tree(root: Path) -> dict[str, str]:
    """Every regular file under ``root`` and the digest of its bytes."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def record(tmp: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    shutil.copy(PROGRAMS / "side_effects.py", tmp)
    return run_py(str(tmp / "side_effects.py"), "run.h5", *args, cwd=tmp, env=env, timeout=300)


def test_bisect_and_verify_leave_every_file_the_crashed_run_left_byte_identical(tmp_path):
    """Was: `replay verify` of a finished run left its metrics.csv at its 10-byte header (the
    program opens it with "w" before its Recorder, and replay ran that again): the forensic
    tool erased the evidence. Now the re-run writes a private copy, its torch.save and its
    log append go there too, and the file it made by the time is removed afterwards."""
    p = record(tmp_path, "--nan-at", "30")
    assert p.returncode != 0 and "loss is nan at step 30" in p.stderr, p.stderr[-2000:]
    before = tree(tmp_path)
    assert len(Path(tmp_path / "metrics.csv").read_text().splitlines()) == 31  # header + 30
    b = replay_cli("bisect", str(tmp_path / "run.h5"), "--json", cwd=tmp_path)
    assert b.returncode == 0, b.stderr[-2000:]
    assert '"first_bad_step": 30' in b.stdout
    v = replay_cli("verify", str(tmp_path / "run.h5"), cwd=tmp_path)
    assert v.returncode == 0, v.stderr[-2000:]
    after = tree(tmp_path)
    made = set(after) - set(before)
    assert made <= {"run.forensics.h5"}, made  # replay's own sidecar, nothing of the program's
    assert {k: after[k] for k in before} == before


def test_a_program_that_removes_its_output_folder_before_its_recorder_is_stopped_first(
    tmp_path,
):
    """A re-run that would `shutil.rmtree` a folder the run left is stopped before anything
    is removed, in one line naming it and what to do (exit 4)."""
    p = record(tmp_path, "--remake")
    assert p.returncode == 0, p.stderr[-2000:]
    before = tree(tmp_path)
    v = replay_cli("verify", str(tmp_path / "run.h5"), cwd=tmp_path)
    assert v.returncode == 4, v.stderr[-2000:]
    said = v.stderr.strip().splitlines()[-1]
    assert "removes outputs, which existed before replay ran it" in said, said
    assert "if not replay.replaying():" in said and "Traceback" not in v.stderr
    assert tree(tmp_path) == before


def test_a_program_that_connects_before_its_recorder_connects_nowhere_on_replay(tmp_path):
    """A logging service initialised again by the re-run: refused, the address named."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []

    def accept() -> None:
        server.settimeout(60)
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    try:
        p = record(tmp_path, "--connect", str(port))
        assert p.returncode == 0, p.stderr[-2000:]
        assert len(accepted) == 1  # the training's own connection
        v = replay_cli("verify", str(tmp_path / "run.h5"), cwd=tmp_path)
        assert v.returncode == 4, v.stderr[-2000:]
        assert f"connects to 127.0.0.1:{port}" in v.stderr.strip().splitlines()[-1]
        time.sleep(0.2)
        assert len(accepted) == 1
    finally:
        server.close()


@pytest.mark.slow
def test_the_self_check_truncates_no_log_and_training_is_bitwise_training_without_it(tmp_path):
    """Was: the background self-check re-ran the program's start-up while the run trained, and
    its `open("metrics.csv", "w")` truncated the log the training was appending to (8, 32 and
    40 of 40 rows became NUL bytes) while the verdict said the run replays. Now its writes go
    to a private copy: every row is there, the losses are bitwise those of a run with the check
    off, and the check replays."""
    on = tmp_path / "on"
    on.mkdir()
    env = {"REPLAY_SELF_CHECK": "1", "REPLAY_SELF_CHECK_NICE": "0"}  # (see test_selfcheck.train)
    p = record(on, "--self-check", "--until-checked", env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    v = read_selfcheck(str(on / "run.h5"))
    assert v is not None and v.status == "ok", (v, p.stderr[-2000:])
    rows = (on / "metrics.csv").read_bytes()
    assert b"\0" not in rows
    steps = len(rows.splitlines()) - 1
    assert steps >= 40 and rows.splitlines()[-1].startswith(f"{steps - 1},".encode())
    assert len(list((on / "outputs").iterdir())) == 1  # the re-run's own file is gone
    off = tmp_path / "off"
    off.mkdir()
    q = record(off, "--steps", "40", env={"REPLAY_SELF_CHECK": "0"})
    assert q.returncode == 0, q.stderr[-2000:]
    first40 = b"".join(rows.splitlines(keepends=True)[:41])
    assert (off / "metrics.csv").read_bytes() == first40  # bitwise the same losses


@pytest.mark.parametrize("planted", ["replay.py", "replay/__init__.py"])
def test_children_import_this_replay_whatever_the_working_directory_holds(tmp_path, planted):
    """Was: the writer and self-check children started as `python -m replay...` from the
    training's directory, so a `replay.py` there (an RL replay buffer) was imported instead of
    the package: the recording was lost and the planted file ran."""
    from replay.child import ENTRY_POINTS, python_module

    marker = tmp_path / "planted-ran"
    (tmp_path / planted).parent.mkdir(exist_ok=True)
    (tmp_path / planted).write_text(f"open({str(marker)!r}, 'w').close()\n")
    script = Path(__file__).resolve().parents[1] / "integration" / "scripts" / "mlp_train.py"
    p = subprocess.run(
        [sys.executable, str(script), "run.h5", "--steps", "12"],
        cwd=tmp_path,
        env={**run_env(), "REPLAY_SELF_CHECK": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "run.h5").exists() and not marker.exists()
    rc, d, err = replay_here_json("info", str(tmp_path / "run.h5"))
    assert rc == 0 and d["health_steps"] == [0, 11], err
    # every child entry point, started from that directory, is this package's
    for module in ENTRY_POINTS:
        c = subprocess.run(
            python_module(module, "--help"), cwd=tmp_path, capture_output=True, timeout=120
        )
        assert not marker.exists(), module
        assert b"planted" not in c.stderr
    with pytest.raises(ValueError):
        python_module("os")


def test_a_killed_self_check_reads_as_an_error_not_running(tmp_path):
    """Was: a self-check child killed by hand left "running" in its verdict for ever."""
    shutil.copy(PROGRAMS / "stop_the_check.py", tmp_path)
    p = run_py(
        str(tmp_path / "stop_the_check.py"), "run.h5", "--signal", "KILL", cwd=tmp_path,
        env={"REPLAY_SELF_CHECK": "1"}, timeout=180,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "status error" in p.stdout, p.stdout
    v = read_selfcheck(str(tmp_path / "run.h5"))
    assert v is not None and v.status == "error" and "signal 9" in v.summary, v


def test_a_stopped_self_check_neither_holds_the_training_stderr_nor_outlives_it(tmp_path):
    """Was: a stopped self-check child held the training's stderr open after the run exited
    (a `| tee` of the run never ended). It holds none of the run's descriptors, and ends with
    the run."""
    shutil.copy(PROGRAMS / "stop_the_check.py", tmp_path)
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, str(tmp_path / "stop_the_check.py"), "run.h5", "--signal", "STOP"],
        cwd=tmp_path,
        env={**run_env(), "REPLAY_SELF_CHECK": "1"},
        capture_output=True,  # run() returns only once every holder of these pipes is gone
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and "sent SIGSTOP" in p.stdout, p.stderr[-2000:]
    assert time.monotonic() - t0 < 100
    pid = int(p.stdout.split("sent SIGSTOP to ")[1].split()[0])
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the stopped self-check {pid} outlived its run")
    v = read_selfcheck(str(tmp_path / "run.h5"))
    assert v is not None and v.status == "error", v


def test_a_forged_verdict_without_the_runs_id_is_not_shown(tmp_path, mlp_nan_run):
    """Was: a planted run.selfcheck.json naming no run made `info` say "replays bitwise" about
    a recording never checked."""
    run = tmp_path / "run.h5"
    shutil.copy(mlp_nan_run, run)
    write_selfcheck(str(run), SelfCheck("ok", "bitwise on cpu", (0, 3)))
    rc, d, err = replay_here_json("info", str(run))
    assert rc == 0, err
    assert not d.get("self_check"), d.get("self_check")

"""After training dies, its writer process commits what training published: while it does,
``replay info`` says so and ``bisect``/``verify`` wait for it instead of replaying a partial
window. A draining writer is recognised by the lock it holds beside the file (store/liveness.py);
here a process holds that lock as a draining writer does, and lets go when the test says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from replay.store.liveness import lock_path, writer_state
from replay.store.writer import RingSpec, StoreWriter
from tests.conftest import SCRIPTS, replay_cli, replay_here, run_env

# Holds the lock as a draining writer does until a line arrives on its stdin (or argv[2] seconds
# pass), then removes the lock file and exits, as a writer that finished does.
HOLDER = """
import fcntl, json, os, select, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": 1, "writer_pid": os.getpid(), "state": "draining",
                         "steps_to_come": 7}).encode())
print("held", flush=True)
select.select([sys.stdin], [], [], float(sys.argv[2]))
os.unlink(sys.argv[1])
"""


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    """A run killed with SIGKILL after its loss went NaN at step 22 (it trains on: --no-raise)."""
    out = tmp_path_factory.mktemp("drain") / "run.h5"
    env = run_env()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "mlp_train.py"), str(out), "--steps", "100000"]
        + ["--nan-at", "22", "--no-raise", "--sleep", "0.002"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    for line in proc.stdout:
        if line.startswith("step ") and int(line.split()[1]) >= 30:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    deadline = time.monotonic() + 60
    while writer_state(str(out)) is not None and time.monotonic() < deadline:
        time.sleep(0.01)  # its writer drains, then lets go
    return out


def _hold(path, seconds):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, lock_path(str(path)), str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def _end(holder):
    holder.kill()
    holder.wait()
    holder.stdin.close()
    holder.stdout.close()


def test_the_writer_says_it_is_draining_in_its_lock_file(tmp_path):
    path = str(tmp_path / "run.h5")
    w = StoreWriter(
        path,
        run_id="x",
        meta={"env": {"pid": 123, "hostname": "h"}},
        sources={},
        steps=RingSpec(4, 4096, 4096),
        snapshots=RingSpec(2, 4096, 4096),
        health_slots=8,
    )
    try:
        state = writer_state(path)
        assert state is not None and not state.draining and state.pid == 123
        w.mark_draining(5)
        state = writer_state(path)
        assert state.draining and state.steps_to_come == 5 and state.writer_pid == os.getpid()
    finally:
        w.close(clean=False)
    assert writer_state(path) is None  # closed: nobody writes it


def test_a_lock_file_left_by_a_killed_writer_is_no_live_writer(tmp_path):
    path = str(tmp_path / "run.h5")
    with open(lock_path(path), "w") as fh:
        json.dump({"pid": 1, "state": "draining", "steps_to_come": 3}, fh)
    assert writer_state(path) is None  # nobody holds the lock: the kernel dropped it


def test_info_says_the_writer_is_draining(nan_run):
    holder = _hold(nan_run, 30)
    try:
        proc = replay_here("info", str(nan_run))
        assert proc.returncode == 0, proc.stderr
        assert "its training died, its writer is still committing: 7 steps to come" in proc.stdout
        d = json.loads(replay_here("info", str(nan_run), "--json").stdout)
        assert d["writer"]["draining"] and d["writer"]["steps_to_come"] == 7
    finally:
        _end(holder)


def test_bisect_waits_for_a_draining_writer_then_replays(nan_run):
    # The writer lets go only once bisect has said it is waiting: however slowly bisect starts
    # (torch's import on a loaded machine takes seconds), it must find the writer still there.
    holder = _hold(nan_run, 120)
    bisect = subprocess.Popen(
        [sys.executable, "-m", "replay", "bisect", str(nan_run), "--json", "--no-trace"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=run_env(),
    )
    try:
        said = []
        for line in bisect.stderr:
            said.append(line)
            if "waiting for its writer" in line:
                break
        assert "waiting for its writer to finish (7 steps to come)" in "".join(said), said
        assert bisect.poll() is None  # it waits: nothing replayed while the writer commits
        holder.stdin.write("done\n")
        holder.stdin.flush()
        out, err = bisect.communicate(timeout=300)
        assert bisect.returncode == 0, "".join(said) + err  # the culprit found
        assert json.loads(out)["first_bad_step"] == 22
    finally:
        if bisect.poll() is None:
            bisect.kill()
            bisect.communicate()
        _end(holder)


def test_verify_gives_up_on_a_writer_that_never_finishes_with_one_line(nan_run):
    holder = _hold(nan_run, 30)
    try:
        proc = replay_cli("verify", str(nan_run), env={"REPLAY_DRAIN_WAIT": "0.5"}, timeout=120)
        assert proc.returncode == 3, proc.stderr
        lines = [ln for ln in proc.stderr.strip().splitlines() if "waiting" not in ln]
        assert len(lines) == 1 and "still committing" in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        _end(holder)

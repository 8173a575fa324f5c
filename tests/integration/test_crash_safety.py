"""The file survives kill -9 at any moment; SIGTERM and readers of a live file behave."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from replay.store import open_recording
from tests.conftest import ROOT, SCRIPTS

sys.path.insert(0, str(SCRIPTS))
import mlp_train  # noqa: E402


def start(out, *extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / "mlp_train.py"), str(out), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for_steps(proc, n):
    for line in proc.stdout:
        if line.startswith("step ") and int(line.split()[1]) >= n:
            return
    raise AssertionError(f"process ended early: {proc.stderr.read()}")


def wait_for_first_commit(out, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if out.exists():
            try:
                with open_recording(out) as rec:
                    if rec.status()["last_step"] >= 0:
                        return
            except Exception:  # noqa: BLE001 - being created; try again
                pass
        time.sleep(0.02)
    raise AssertionError("no step was committed within the timeout")


def check_intact(path, vary=True):
    """Every committed step holds exactly the batch the script made for it."""
    with open_recording(path) as rec:
        steps = rec.steps()
        for t in steps:
            x, y = mlp_train.make_batch(int(t), vary)
            got = rec.read_step(int(t))["batch"]
            assert np.array_equal(got[0].data, x.numpy()), f"step {t}: torn batch"
            assert np.array_equal(got[1].data, y.numpy())
        for s in rec.snapshot_steps():
            snap = rec.read_snapshot(int(s))
            assert snap["step"] == s and "0.weight" in snap["model"]
        h = rec.health()
        assert np.all(np.diff(h["step"]) == 1), "health rows must be consecutive"
        assert np.isfinite(h["loss"]).all()
        return len(steps), rec.replayable_window()


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_every_flushed_step_intact(tmp_path):
    rng = random.Random(1234)
    kills = int(os.environ.get("REPLAY_KILLS", "8"))
    committed = []
    for i in range(kills):
        out = tmp_path / f"run{i}.h5"
        proc = start(out, "--steps", "100000", "--snapshot-every", "3", "--vary")
        wait_for_steps(proc, rng.randint(0, 30))
        wait_for_first_commit(out)  # writing is asynchronous: kill while it is under way
        time.sleep(rng.uniform(0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
        time.sleep(0.5)  # the writer process commits what it had received, then closes
        n, window = check_intact(out)
        assert window is not None or n == 0
        committed.append(n)
    assert all(n > 0 for n in committed)


def test_sigterm_flushes_and_closes_the_file(tmp_path):
    out = tmp_path / "run.h5"
    proc = start(out, "--steps", "100000", "--sleep", "0.005")
    wait_for_steps(proc, 15)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == -signal.SIGTERM  # the process still dies of SIGTERM, after closing
    proc.stdout.close()
    proc.stderr.close()
    with open_recording(out) as rec:
        assert rec.closed_cleanly
        assert rec.status()["last_step"] >= 15
    check_intact(out, vary=False)


def test_a_reader_follows_a_file_while_it_is_written(tmp_path):
    out = tmp_path / "run.h5"
    proc = start(out, "--steps", "400", "--sleep", "0.002", "--snapshot-every", "5")
    try:
        wait_for_steps(proc, 5)
        wait_for_first_commit(out)
        seen = []
        deadline = time.time() + 60
        while proc.poll() is None and time.time() < deadline:
            with open_recording(out) as rec:
                steps = rec.steps()
                if len(steps):
                    t = int(steps[-1])
                    x, _ = mlp_train.make_batch(t)
                    try:
                        got = rec.read_step(t)["batch"][0].data
                    except KeyError:  # overwritten between listing and reading: fine
                        continue
                    assert np.array_equal(got, x.numpy())
                    seen.append(t)
            time.sleep(0.05)
        assert len(set(seen)) >= 3, "the reader should see the file grow"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()

"""The file survives kill -9 at any moment; SIGTERM and readers of a live file behave."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time

import mlp_train
import numpy as np
import pytest

from replay.store import open_recording
from replay.store.liveness import writer_state
from tests.conftest import SCRIPTS, run_env


def start(out, *extra):
    env = run_env()
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


def _progress(out) -> int:
    try:
        with open(f"{out}.progress", "rb") as fh:
            raw = fh.read(8)
    except FileNotFoundError:
        return 0
    return int(np.frombuffer(raw, "<i8")[0]) if len(raw) == 8 else 0


def _wait(cond, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.mark.slow
def test_sigkill_loses_at_most_the_step_in_flight(tmp_path):
    """16 kills (REPLAY_KILLS; 200 in `make soak`) at random moments, of a loop of
    sub-millisecond steps and of a slower one: every file opens, and it holds every step the
    loop saw complete (its own progress counter), plus at most the step in flight."""
    import kill_target

    kills = int(os.environ.get("REPLAY_KILLS", "16"))  # make soak: 200
    env = run_env()
    server = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "kill_target.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    rng = random.Random(20261204)
    in_flight = 0

    started: list[int] = []

    def start_run(i):
        kind = "fast" if i % 2 == 0 else "slow"
        out = tmp_path / f"run{i}.h5"
        server.stdin.write(f"RUN {out} {kind} {i}\n")
        server.stdin.flush()
        started.append(int(server.stdout.readline()))
        return kind, out, started[-1]

    def check(kind, out):
        done = _progress(out)
        with open_recording(out) as rec:
            last = rec.status()["last_step"]
            assert done - 1 <= last <= done, (kind, done, last)
            slots = rec.reach()["step_slots"]  # every step back to the oldest kept snapshot
            assert list(rec.steps()) == list(range(max(0, last + 1 - slots), last + 1))
            h = rec.health()
            assert list(h["step"]) == list(range(last + 1)), "a health row is missing"
            x, y = kill_target.make_batch(kind, done - 1)
            got = rec.read_step(done - 1)["batch"]
            assert np.array_equal(got[0].data, x.numpy())
            assert np.array_equal(got[1].data, y.numpy())
            assert rec.replayable_window() is not None
        os.remove(out)
        return last == done

    try:
        # A few runs at a time (most of a run's life is its writer process starting), each
        # killed at its own random moment after its first step completed.
        at_once = 8
        for first in range(0, kills, at_once):
            runs = [start_run(i) for i in range(first, min(first + at_once, kills))]
            for _, out, _ in runs:
                _wait(lambda out=out: _progress(out) >= 1, "the first step")
            t0 = time.monotonic()
            delays = sorted((rng.uniform(0.0, 0.3), k) for k in range(len(runs)))
            for delay, k in delays:
                time.sleep(max(0.0, t0 + delay - time.monotonic()))
                os.kill(runs[k][2], signal.SIGKILL)
            for kind, out, _ in runs:
                # The writer process outlives training: wait until it has drained, let go.
                _wait(lambda out=out: writer_state(str(out)) is None, "the writer to finish")
                in_flight += check(kind, out)
    finally:
        for pid in started:  # a run a failure left unkilled would train on (and its check)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        server.stdin.close()
        server.wait(30)
        server.stdout.close()
    print(f"{kills} kills; the step in flight was in the file {in_flight} times")

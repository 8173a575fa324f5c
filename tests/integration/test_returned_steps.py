"""Issue 32: a step is durable once ``rec.step`` returns (real processes, real SIGKILLs).

The runs come from ``scripts/kill_target.py``, a fork server (torch imported once); each run
keeps its own count of the steps that returned in ``OUT.h5.progress``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from replay.store import open_recording
from replay.store.liveness import writer_state
from tests.conftest import SCRIPTS, run_env


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


def _returned_at(out, done: int) -> np.ndarray:
    """When each of the run's ``done`` steps returned (``time.time()``, the loop's own clock)."""
    with open(f"{out}.progress", "rb") as fh:
        return np.frombuffer(fh.read()[16 : 16 + 8 * done], "<f8")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def server():
    env = run_env()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "kill_target.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )

    def run(out, kind, kill_at=None):
        line = f"RUN {out} {kind} 0" + ("" if kill_at is None else f" {kill_at}")
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        return int(proc.stdout.readline())

    yield run
    proc.stdin.close()
    proc.wait(30)
    proc.stdout.close()


def test_a_step_larger_than_the_step_log_is_in_the_file_once_it_returned(server, tmp_path):
    """Was: a 50 MB batch (the step log holds 64 MiB, a record at most half) went by the writer
    thread, which had not passed it on when ``rec.step`` returned; SIGKILL right after step k
    returned left (k, steps in the file) = (2,1) (3,1) (4,2) (5,2)."""
    import kill_target

    for k in (2, 3, 5):
        out = tmp_path / f"big{k}.h5"
        pid = server(out, "big", k)
        _wait(lambda pid=pid: _gone(pid), "the run to kill itself")
        _wait(lambda out=out: writer_state(str(out)) is None, "the writer to finish")
        assert _progress(out) == k
        with open_recording(out) as rec:
            assert list(rec.steps()) == list(range(k)), (k, list(rec.steps()))
            x, y = kill_target.make_batch("big", k - 1)
            got = rec.read_step(k - 1)["batch"]
            assert np.array_equal(got[0].data, x.numpy())
            assert np.array_equal(got[1].data, y.numpy())


def test_a_step_larger_than_the_step_log_warns_once_that_training_waits(tmp_path):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import replay
    from replay.errors import RecorderWarning

    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        x, y = batch
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    rows = 1_250_000  # 50 MB a step: a record larger than half the 64 MiB log
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with replay.Recorder(
            tmp_path / "run.h5",
            objects={"model": model, "optimizer": opt},
            step_fn=step,
            self_check=False,
        ) as rec:
            for t in range(3):
                rec.step((torch.full((rows, 8), float(t)), torch.zeros(rows, dtype=torch.long)))
    said = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    assert sum("did not fit the recorder's step log" in m for m in said) == 1, said
    with open_recording(tmp_path / "run.h5") as r:
        assert list(r.steps()) == [0, 1, 2]


def _writer_of(pid: int) -> int:
    """The training process's writer process (its child running writer_process)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as fh:
            for child in fh.read().split():
                with open(f"/proc/{child}/cmdline", "rb") as cmd:
                    if b"replay.store.writer_process" in cmd.read():
                        return int(child)
    raise AssertionError("no writer process")


def _stalls(out, quiet=1.0) -> bool:
    """Whether the run's progress stays put for ``quiet`` seconds."""
    before = _progress(out)
    time.sleep(quiet)
    return _progress(out) == before


@pytest.mark.slow  # (about 35 s: training fills the 64 MiB log with small steps first)
def test_a_stopped_then_killed_writer_loses_no_returned_step(server, tmp_path):
    """Was: SIGSTOP the writer process, let training fill the shared step log and wait, then
    SIGKILL the writer: the 816 steps that had returned and sat in the log were lost, while the
    warning said every step is safe once it returns. Now a new writer process takes over the
    file and the log, commits them, and the warning says so."""
    import kill_target

    out = tmp_path / "stopped.h5"
    pid = server(out, "fast")
    _wait(lambda: _progress(out) >= 20, "the first steps")
    writer = _writer_of(pid)
    os.kill(writer, signal.SIGSTOP)
    _wait(lambda: _stalls(out), "training to wait for the stopped writer", timeout=120)
    returned = _progress(out)
    os.kill(writer, signal.SIGKILL)
    _wait(lambda: _progress(out) >= returned + 50, "training to go on unrecorded")
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: _gone(pid), "the run to die")
    _wait(lambda: writer_state(str(out)) is None, "the writer to finish")
    with open_recording(out) as rec:
        last = rec.status()["last_step"]
        assert last >= returned - 1, (returned, last)
        h = rec.health()
        assert list(h["step"]) == list(range(h["step"][0], last + 1))
        assert rec.steps()[-1] == last
        x, y = kill_target.make_batch("fast", returned - 1)
        got = rec.read_step(returned - 1)["batch"]
        assert np.array_equal(got[0].data, x.numpy())
        assert np.array_equal(got[1].data, y.numpy())
    said = (tmp_path / "stopped.h5.warnings").read_text()
    assert "a new writer process committed" in said, said
    assert "may be missing" not in said, said  # (the step in flight was committed again)
    assert "every step is safe once it returns" in said  # the wait was said first
    assert f"unrecorded from step {last + 1}" in said, said


@pytest.mark.slow
def test_a_process_group_kill_loses_at_most_the_documented_bound(server, tmp_path):
    """Was: ``kill -9 -PGID`` (which kills the writer process too) lost up to 1,657 steps =
    1.20 s, while the docs said at most the last 0.2 s. 16 group kills (REPLAY_KILLS; 200 in
    `make soak`) of a loop
    of sub-millisecond steps, a few runs at a time, each at a random moment: every file opens
    with steps in its ring, the newest one's batch intact, every health row before it, a
    replayable window, and the steps lost are at most LAG_STEPS, run within LAG_SECONDS plus
    the last step's own time (the bound is checked before a step runs: the step during which it
    is reached still returns; by the loop's own clock), plus a slack."""
    import random

    import kill_target

    from replay.record.step_log_writer import LAG_SECONDS, LAG_STEPS

    kills = int(os.environ.get("REPLAY_KILLS", "16"))  # make soak: 200
    rng = random.Random(20261205)
    lost_steps, lost_s, over = [], [], []

    def check(out):
        done = _progress(out)
        returned = _returned_at(out, done)
        with open_recording(out) as rec:
            # A kill in the middle of a commit's last flush can leave some of its markers
            # written and some not (and the status ahead of them): the slots still invalid are
            # simply not there. The steps in the ring are what counts.
            steps = [int(t) for t in rec.steps()]
            assert steps, ("no step left in the ring", done, rec.status())
            last = steps[-1]
            assert last < done, (done, last)
            h = rec.health()
            assert list(h["step"][: last + 1]) == list(range(last + 1)), "a health row is missing"
            x, y = kill_target.make_batch("fast", last)
            got = rec.read_step(last)["batch"]
            assert np.array_equal(got[0].data, x.numpy())
            assert np.array_equal(got[1].data, y.numpy())
            snaps = [int(s) for s in rec.snapshot_steps()]
            assert rec.replayable_window() is not None, (steps[:3], steps[-3:], snaps, done)
            lost_steps.append(done - 1 - last)
            # the seconds of steps lost: from the end of the first one lost to the end of the
            # last one that returned (a wait before the first, for the file, is no step)
            lost_s.append(float(returned[-1] - returned[last + 1]) if last + 1 < done else 0.0)
            last_step_s = float(returned[-1] - returned[-2]) if done >= 2 else 0.0
            # (+ slack: on two cores loaded by other work, up to 0.14 s more was measured, not
            # yet explained; docs/recording.md says so)
            if lost_s[-1] > LAG_SECONDS + last_step_s + 0.2:
                over.append((lost_s[-1], last_step_s))
        os.remove(out)

    at_once = 4
    started: list[int] = []  # every run's process group: none outlives a failure here
    try:
        for first in range(0, kills, at_once):
            runs = []
            for i in range(first, min(first + at_once, kills)):
                out = tmp_path / f"group{i}.h5"
                runs.append((out, server(out, "fast-group")))
                started.append(runs[-1][1])
            for out, _ in runs:
                _wait(lambda out=out: _progress(out) >= 1, "the first step")
            t0 = time.monotonic()
            killed = []
            for delay, k in sorted((rng.uniform(0.05, 0.8), k) for k in range(len(runs))):
                time.sleep(max(0.0, t0 + delay - time.monotonic()))
                os.killpg(runs[k][1], signal.SIGKILL)
                killed.append(runs[k][0])
            for out in killed:
                _wait(lambda out=out: writer_state(str(out)) is None, "the lock to be let go")
                check(out)
    finally:
        for pid in started:  # (a run this test failed to kill trained on, and its self-check)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    worst = max(range(len(lost_s)), key=lambda i: lost_s[i])
    print(
        f"{kills} group kills: steps lost median {int(np.median(lost_steps))}, max "
        f"{max(lost_steps)}; seconds lost median {np.median(lost_s):.3f}, max "
        f"{lost_s[worst]:.3f} ({lost_steps[worst]} steps)"
    )
    assert not over, f"lost more than LAG_SECONDS plus the last step (lost s, last step s): {over}"
    assert max(lost_steps) <= LAG_STEPS + 1  # (+ the step in flight)


def _killed_writer_run(tmp_path, steps_after: int):
    """Five steps, ``SIGKILL`` of the writer process, ``steps_after`` more steps, close."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import replay
    from replay.errors import RecorderWarning

    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        x, y = batch
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def batch(t):
        return torch.full((4, 8), float(t)), torch.full((4,), t % 4)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = replay.Recorder(
            tmp_path / "run.h5",
            objects={"model": model, "optimizer": opt},
            step_fn=step,
            self_check=False,
        )
        for t in range(5):
            rec.step(batch(t))
        writer = rec.transport.client.proc
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(10)
        for t in range(5, 5 + steps_after):
            rec.step(batch(t))
        rec.close()
    said = [str(w.message) for w in caught if issubclass(w.category, RecorderWarning)]
    return said, batch


def test_training_close_commits_what_a_killed_writer_left_in_the_step_log(tmp_path):
    """The writer process SIGKILLed after the last step: the steps that returned sit in the
    shared log; training's close has a new writer process commit them."""
    said, batch = _killed_writer_run(tmp_path, 0)
    assert any("a new writer process committed" in m for m in said), said
    with open_recording(tmp_path / "run.h5") as r:
        assert list(r.steps()) == list(range(5))
        assert np.array_equal(r.read_step(4)["batch"][0].data, batch(4)[0].numpy())
        assert list(r.health()["step"]) == list(range(5))


def test_the_step_after_a_writer_died_has_a_new_one_commit_the_log_first(tmp_path):
    """Was: the recorder looked at its writer process every 64 steps, and the steps that returned
    in between went into a log nobody read: a run killed within them lost every one (the
    stopped-then-killed writer test failed half the time). Now the next step notices, a new
    writer process commits the log before it runs, and recording stops there, saying so."""
    said, _ = _killed_writer_run(tmp_path, 35)
    assert any(
        "a new writer process committed" in m and "unrecorded from step 5" in m for m in said
    ), said
    with open_recording(tmp_path / "run.h5") as r:
        assert list(r.steps()) == list(range(5))
        assert list(r.health()["step"]) == list(range(5))

"""A writer that falls behind makes training wait once ``max_pending_steps`` are pending, the
oldest ``max_pending_seconds`` ago, so that a kill -9 of the training process loses at most that
backlog (before, only ``max_pending_bytes`` = 1 GiB bounded it: 1981 MLP steps behind after 2000
at nice 19, all of them lost to a kill)."""

from __future__ import annotations

import threading
import time
import warnings

import replay
from replay.errors import RecorderWarning
from replay.store import open_recording

from .test_record import batch_for, build, train_step


class StalledDisk:
    """The recorder's real store, whose commits wait while ``open`` is clear: a disk that stalls."""

    def __init__(self, store):
        self.store = store
        self.open = threading.Event()
        self.open.set()

    def commit(self, **kw):
        self.open.wait()
        self.store.commit(**kw)

    def sync(self):
        self.store.sync()

    def close(self, *, clean=True, ended=None):
        self.store.close(clean=clean, ended=ended)


def test_training_waits_for_a_stalled_writer_once_the_backlog_is_both_long_and_old(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("REPLAY_STEP_LOG", "off")  # the writer thread's way (GPU steps)
    path = tmp_path / "run.h5"
    model, opt = build()
    rec = replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        max_pending_steps=12,
        max_pending_seconds=0.3,
        handle_signals=False,
        reach=0,  # the dense ring alone: the last 150 steps, all of them written
    )
    disks = []
    make_store = rec.transport._make_store

    def stalling_store(client):
        disks.append(StalledDisk(make_store(client)))
        return disks[0]

    rec.transport._make_store = stalling_store  # read when the writer starts, at the first step
    rec.step(batch_for(0))  # the first step waits until the file holds it
    steps = 3000
    done = []
    said = []

    def train():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for t in range(1, steps):
                rec.step(batch_for(t))
                done.append(t)
        said.extend(str(w.message) for w in caught if issubclass(w.category, RecorderWarning))
        where.extend(w.filename for w in caught if issubclass(w.category, RecorderWarning))

    where: list[str] = []  # (was replay/record/recorder.py: the wait was said at replay's line)
    disks[0].open.clear()
    stalled = time.monotonic()
    trainer = threading.Thread(target=train)
    trainer.start()
    deadline = stalled + 30
    while rec.transport.writer.throttled == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    waited_after = time.monotonic() - stalled
    stuck_at = len(done)
    time.sleep(0.3)
    try:
        assert rec.transport.writer.throttled > 0, "training never waited for the stalled writer"
        assert len(done) == stuck_at, "training went on while the writer was stalled"
        # 12 steps alone were no reason to wait: the backlog was young until 0.3 s had passed
        assert stuck_at > 12 and waited_after >= 0.3
        assert stuck_at < steps - 1, "the loop ended before the backlog was 0.3 s old"
    finally:
        disks[0].open.set()
        trainer.join(120)
    rec.close()
    assert done == list(range(1, steps))
    assert len(said) == 1 and "training waited for the recorder's writer" in said[0], said
    assert where == [__file__], where  # the program's own line, rec.step's
    with open_recording(path) as r:  # the ring keeps the last 150 steps, all of them written
        assert list(r.steps()) == list(range(steps - 150, steps))


def test_training_waits_for_a_stopped_writer_process_when_the_step_log_is_full(
    tmp_path, monkeypatch
):
    # The step log (the CPU path) is bounded: a writer process that stops reading (SIGSTOP: a
    # disk that hangs, a starved process) makes training wait for room, never lose a step.
    import os
    import signal

    from replay.record import transport as transport_module

    monkeypatch.setattr(transport_module, "LOG_BYTES", 256 << 10)
    path = tmp_path / "run.h5"
    model, opt = build()
    rec = replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        handle_signals=False,
        reach=0,  # the dense ring alone: the last 150 steps
    )
    assert rec.transport.log is not None and rec.transport.log.log.size == 256 << 10
    rec.step(batch_for(0))  # the first step waits until the file holds it
    writer = rec.transport.client.proc.pid
    steps = 2000
    done = []
    said = []

    def train():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for t in range(1, steps):
                rec.step(batch_for(t))
                done.append(t)
        said.extend(str(w.message) for w in caught if issubclass(w.category, RecorderWarning))

    os.kill(writer, signal.SIGSTOP)
    trainer = threading.Thread(target=train)
    try:
        trainer.start()
        log = rec.transport.log
        # Training waits for room in the full log, or, where steps are slow (a loaded machine),
        # first for the records the stopped writer has left unread longer than LAG_SECONDS:
        # either way it waits (failed on load 7-14: the lag bound came first, `waited` stayed 0)
        deadline = time.monotonic() + 30
        while log.waited + log.lagged == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        stuck_at = len(done)
        time.sleep(0.3)
        assert log.waited + log.lagged > 0, "training never waited for the stopped writer"
        assert len(done) == stuck_at, "training went on while the log was full"
        assert 0 < stuck_at < steps - 1
    finally:
        os.kill(writer, signal.SIGCONT)
        trainer.join(120)
    rec.close()
    assert done == list(range(1, steps))
    assert rec.transport.log.overflowed == 0  # every step went through the log
    assert len(said) == 1 and "writer process" in said[0], said
    with open_recording(path) as r:
        assert list(r.steps()) == list(range(steps - 150, steps))
        assert list(r.health()["step"]) == list(range(steps))

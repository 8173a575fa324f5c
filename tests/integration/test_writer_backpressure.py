"""A writer that falls behind makes training wait after ``max_pending_steps``, so that a kill -9
of the training process loses at most that many steps (before, only ``max_pending_bytes`` = 1 GiB
bounded the backlog: 1981 MLP steps behind after 2000 at nice 19, all of them lost to a kill)."""

from __future__ import annotations

import threading
import time

import torch

import replay
from replay.store import open_recording

from .test_record import build, train_step


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

    def close(self, *, clean=True):
        self.store.close(clean=clean)


def batch(t):
    g = torch.Generator().manual_seed(t)
    return {"x": torch.randn(5, 6, generator=g), "y": torch.randint(0, 3, (5,), generator=g)}


def test_training_waits_for_a_stalled_writer_once_max_pending_steps_are_handed_over(tmp_path):
    path = tmp_path / "run.h5"
    model, opt = build()
    rec = replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        max_pending_steps=12,
        handle_signals=False,
    )
    disks = []
    make_store = rec._make_store

    def stalling_store():
        disks.append(StalledDisk(make_store()))
        return disks[0]

    rec._make_store = stalling_store  # read when the writer starts, at the first step
    rec.step(batch(0))  # the first step waits until the file holds it
    disks[0].open.clear()
    done = []

    def train():
        for t in range(1, 60):
            rec.step(batch(t))
            done.append(t)

    trainer = threading.Thread(target=train)
    trainer.start()
    deadline = time.monotonic() + 30
    while rec._writer.throttled == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    stuck_at = len(done)
    time.sleep(0.3)
    try:
        assert rec._writer.throttled > 0, "training never waited for the stalled writer"
        assert len(done) == stuck_at, "training went on while the writer was stalled"
        # nothing was committed since the stall: every step after step 0 is still pending
        assert stuck_at <= 12
        assert rec._writer.max_pending_seen <= 12
    finally:
        disks[0].open.set()
        trainer.join(60)
    rec.close()
    assert done == list(range(1, 60))
    with open_recording(path) as r:
        assert list(r.steps()) == list(range(60))

"""The shared-memory ring that carries frame bodies from the recorder to its writer process."""

from __future__ import annotations

import os

import mlp_train
import numpy as np
import pytest
import torch

from replay.store import open_recording, writer_process
from replay.store.frame_ring import FrameRing

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd is Linux-only")


def _parts(n, fill):
    return [np.full(n // 2, fill, np.uint8), np.full(n - n // 2, fill, np.uint8)]


def test_bodies_round_trip_and_never_wrap_or_overrun_the_child():
    parent = FrameRing.create(size=1000)
    child = FrameRing.attach(os.dup(parent.fd))
    try:
        placed = [parent.put(_parts(300, i), 300) for i in range(3)]
        assert [p[0] for p in placed] == [0, 300, 600]
        assert parent.put(_parts(300, 9), 300) is None  # 100 bytes left at the end: no wrap
        for i, (offset, _) in enumerate(placed):
            assert (np.frombuffer(child.body(offset, 300), np.uint8) == i).all()
        child.release(placed[0][1])  # the child committed the first body only
        offset, end = parent.put(_parts(300, 7), 300)
        assert (offset, end) == (0, 1300)  # skipped the 100-byte tail, wrote over body 0
        assert (np.frombuffer(child.body(300, 300), np.uint8) == 1).all()  # body 1 untouched
        assert parent.put(_parts(300, 8), 300) is None  # bodies 1 and 2 are not released
        child.release(end)
        assert parent.put(_parts(1001, 1), 1001) is None  # larger than the ring: the pipe's
        assert parent.put(_parts(1000, 1), 1000) == (0, 3000)  # all released: the whole ring
    finally:
        parent.close()
        child.close()


def test_a_recording_is_intact_when_bodies_overflow_the_ring_into_the_pipe(tmp_path, monkeypatch):
    # The writer thread's way (GPU steps, or no step log): every step goes through it here.
    monkeypatch.setenv("REPLAY_STEP_LOG", "off")
    create = FrameRing.create
    monkeypatch.setattr(
        writer_process.FrameRing, "create", classmethod(lambda cls: create(size=64 << 10))
    )
    placed, put = [], FrameRing.put

    def counting_put(self, parts, n):
        where = put(self, parts, n)
        placed.append(where is not None)
        return where

    monkeypatch.setattr(FrameRing, "put", counting_put)
    path = str(tmp_path / "run.h5")
    with mlp_train.recorder(path, snapshot_every=40, keep_snapshots=2) as rec:
        assert rec.transport.client.ring is not None and rec.transport.client.ring.size == 64 << 10
        for t in range(60):
            n = 1 + 200 * (t % 5)  # up to 12.8 KB a step: some commits fit, some do not
            rec.step((torch.full((n, 16), float(t)), torch.zeros(n, dtype=torch.long)))
            if t % 7 == 0:
                rec.flush()
    assert any(placed) and not all(placed)  # both ways were taken
    with open_recording(path) as r:
        for t in range(60):
            x = r.read_step(t)["batch"][0].data
            assert x.shape == (1 + 200 * (t % 5), 16) and (x == t).all(), t

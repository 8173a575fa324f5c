"""One recording opened twice in a process (the TUI's rank view does it on every refresh).

HDF5 2.0 / h5py 3.16: a ``refresh()`` of a dataset that two open Files of one SWMR file both hold
made both read the first chunk's data in place of chunks never written: a 3-step health ring
read as thousands of steps. The reader now shares one File per file (replay/store/reader.py)."""

from __future__ import annotations

import os

import numpy as np

from replay.store import HEALTH_COLUMNS
from replay.store.contracts import HealthFrame
from replay.store.reader import _SHARED, open_recording
from replay.store.writer import RingSpec, StoreWriter


def _recording(path: str) -> None:
    w = StoreWriter(
        path,
        run_id="f" * 32,
        meta={"config": {}},
        sources={},
        steps=RingSpec(4, 4096, 4096),
        snapshots=RingSpec(2, 4096, 4096),
        health_slots=20_000,  # chunks of 8192 markers: most never written
    )
    rows = [HealthFrame(s, np.full(len(HEALTH_COLUMNS), float(s))) for s in range(3)]
    w.commit(health=rows, last_step=2)
    w.close()


def test_two_opens_of_one_file_read_the_same_health(tmp_path):
    path = str(tmp_path / "run.h5")
    _recording(path)
    a = open_recording(path)
    b = open_recording(path)
    try:
        assert a.f is b.f  # one File, one handle per dataset
        for _ in range(2):
            for rec in (a, b, a):
                h = rec.health()
                assert h["step"].tolist() == [0, 1, 2]
                assert h["loss"].tolist() == [0.0, 1.0, 2.0]
        a.close()
        a.close()  # idempotent
        assert b.health()["step"].tolist() == [0, 1, 2]
    finally:
        b.close()
    st = os.stat(path)  # this file's entry only: another test may hold others open
    assert (st.st_dev, st.st_ino) not in _SHARED
    with open_recording(path) as c:  # a fresh File once every user closed
        assert c.health()["step"].tolist() == [0, 1, 2]

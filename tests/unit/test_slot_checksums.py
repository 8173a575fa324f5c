"""Every ring slot and health row carries a CRC-32 of its step and bytes (format v2), written in
the same commit as its payload, so a reader can tell a damaged slot from a good one."""

from __future__ import annotations

import sys

import h5py
import numpy as np

from replay.store.writer import health_crc, slot_crc
from tests.conftest import SCRIPTS

sys.path.insert(0, str(SCRIPTS))
import mlp_train  # noqa: E402


def test_every_committed_slot_and_health_row_has_its_checksum(tmp_path):
    path = tmp_path / "run.h5"
    with mlp_train.recorder(path, snapshot_every=4, keep_snapshots=2) as rec:
        for t in range(11):
            rec.step(mlp_train.make_batch(t, vary=True))
    with h5py.File(path, "r", swmr=True) as f:
        for ring in ("steps", "snapshots"):
            g = f[ring]
            used = np.flatnonzero(g["step"][()] >= 0)
            assert used.size
            for slot in used:
                payload = g["arena"][slot, : g["nbytes"][slot]]
                assert g["crc"][slot] == slot_crc(int(g["step"][slot]), payload)
                # the step is part of it: a slot labelled with another step fails
                assert g["crc"][slot] != slot_crc(int(g["step"][slot]) + 1, payload)
        h = f["health"]
        rows = np.flatnonzero(h["step"][()] >= 0)
        assert rows.size == 11
        for slot in rows:
            assert h["crc"][slot] == health_crc(int(h["step"][slot]), h["values"][slot])

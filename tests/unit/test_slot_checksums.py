"""Every ring slot and health row carries a CRC-32 of its step and bytes (format v2), written in
the same commit as its payload, so a reader can tell a damaged slot from a good one."""

from __future__ import annotations

import h5py
import mlp_train
import numpy as np

from replay.store.checksum import health_crc, slot_crc


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


def _flip(path, dataset, index):
    """Flip one byte of ``dataset`` at ``index``, as a bad disk or an interrupted copy would."""
    with h5py.File(path, "r+") as f:
        ds = f[dataset]
        v = ds[index]
        if ds.dtype == np.uint8:
            ds[index] = v ^ 0xFF
        else:
            ds[index] = v * 2 + 1


def test_a_damaged_step_is_reported_missing_and_the_window_shrinks_around_it(tmp_path):
    from replay.store import open_recording
    from replay.store.reader import DamagedSlot

    path = tmp_path / "run.h5"
    with mlp_train.recorder(path, snapshot_every=4, keep_snapshots=3) as rec:
        for t in range(12):
            rec.step(mlp_train.make_batch(t))
    with open_recording(path) as r:
        assert (r.replayable_window().first, r.replayable_window().last) == (0, 11)
        slot = int(np.flatnonzero(r._markers("steps") == 9)[0])
        n = int(r._read("steps/nbytes", slot))
    _flip(path, "steps/arena", (slot, n - 5))  # a byte of step 9's batch
    with open_recording(path) as r:
        assert r.damaged_steps() == [9]
        w = r.replayable_window()
        assert (w.first, w.last) == (0, 8)  # never a replay of step 9's zeros or garbage
        try:
            r.read_step(9)
        except DamagedSlot as e:
            assert "step 9" in str(e) and "damaged" in str(e)
        else:
            raise AssertionError("a damaged step was read back")
        r.read_step(8)  # its neighbours are fine
    from replay.cli.info import describe, render

    report = describe(str(path))
    d = report.to_json()  # (what --json prints)
    assert d["damaged_steps"] == [9] and d["replayable_window"] == [0, 8]
    assert "DAMAGED         step records 9" in render(report)


def test_a_damaged_health_row_is_dropped(tmp_path):
    from replay.store import open_recording

    path = tmp_path / "run.h5"
    with mlp_train.recorder(path, snapshot_every=4) as rec:
        for t in range(6):
            rec.step(mlp_train.make_batch(t))
    with h5py.File(path, "r") as f:
        slot = int(np.flatnonzero(f["health/step"][()] == 3)[0])
    _flip(path, "health/values", (slot, 0))
    with open_recording(path) as r:
        assert r.health()["step"].tolist() == [0, 1, 2, 4, 5]
        assert r.damaged_health == {3}

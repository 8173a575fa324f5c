"""``Recording.snapshot_devices`` reads where each part of a snapshot lived from its manifest
alone. It walked the manifest's value lists as nodes, so a complex number in a snapshot (its two
parts are strings in its ``v`` list) raised AttributeError where the replay opens its window."""

from __future__ import annotations

import numpy as np
import torch

from replay.store import HEALTH_COLUMNS
from replay.store.contracts import HealthFrame, SnapshotFrame
from replay.store.reader import open_recording
from replay.store.writer import RingSpec, StoreWriter, pack_parts


def _recording(path: str, snapshot: dict[str, object]) -> None:
    w = StoreWriter(
        path,
        run_id="d" * 32,
        meta={"config": {}},
        sources={},
        steps=RingSpec(4, 4096, 4096),
        snapshots=RingSpec(2, 1 << 16, 1 << 16),
        health_slots=16,
    )
    payload, mlen = pack_parts(snapshot)
    w.commit(
        snapshots=[SnapshotFrame(0, 0, payload, mlen)],
        health=[HealthFrame(0, np.zeros(len(HEALTH_COLUMNS)))],
        last_step=0,
    )
    w.close()


def test_a_complex_number_in_a_snapshot_raised_in_snapshot_devices(tmp_path):
    path = str(tmp_path / "run.h5")
    optimizer = {"param_groups": [{"lr": 0.1, "phase": 1 + 2j}], "state": {}}
    model = {"w": torch.zeros(3, dtype=torch.float64), "b": torch.ones(1)}
    _recording(path, {"optimizer": optimizer, "model": model, "scaler": {"scale": 2.0 + 0j}})
    with open_recording(path) as rec:
        assert rec.snapshot_devices(0) == {"optimizer": "cpu", "model": "cpu", "scaler": "cpu"}

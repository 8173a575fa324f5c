"""Every archived recording (tests/data/recording_v*.h5) still reads back exactly.

The archives were written by tests/data/make_archive.py with the release that introduced each
format version. A change to the format must keep these readable or refuse them with a message.
"""

from __future__ import annotations

import glob
import os

import mlp_train
import numpy as np
import pytest

from replay.store import FORMAT_VERSION, open_recording

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
ARCHIVES = sorted(glob.glob(os.path.join(DATA, "recording_v*.h5")))


def test_the_current_format_version_is_archived():
    assert os.path.join(DATA, f"recording_v{FORMAT_VERSION}.h5") in ARCHIVES


@pytest.mark.parametrize("path", ARCHIVES, ids=os.path.basename)
def test_archived_recording_reads_back(path):
    with open_recording(path) as rec:
        assert rec.closed_cleanly
        if rec.format_version >= 3:  # tiered snapshots: every step back to step 0 is kept
            assert rec.steps().tolist() == list(range(12))
            assert rec.snapshot_steps().tolist() == [0, 4, 8]
            assert (rec.replayable_window().first, rec.reach()["reach"]) == (0, 10_000)
        else:  # one ring of keep_snapshots * snapshot_every = 2 * 4 steps
            assert rec.steps().tolist() == list(range(4, 12))
            assert rec.snapshot_steps().tolist() == [4, 8]
            assert (rec.replayable_window().first, rec.reach()["reach"]) == (4, 5)
        assert rec.replayable_window().last == 11
        for t in rec.steps():
            x, y = mlp_train.make_batch(int(t), vary=True)
            batch = rec.read_step(int(t))["batch"]
            assert np.array_equal(batch[0].data, x.numpy()) and batch[0].dtype == "float32"
            assert np.array_equal(batch[1].data, y.numpy()) and batch[1].dtype == "int64"
        snap = rec.read_snapshot(8)
        assert snap["model"]["0.weight"].data.shape == (32, 16)
        assert set(snap["optimizer"]["state"]) == {0, 1, 2, 3}
        h = rec.health()
        assert h["step"].tolist() == list(range(12))
        assert np.isfinite(h["loss"]).all() and (h["loss_nonfinite"] == 0).all()
        assert rec.entry["step_fn"]["qualname"] == "train_step"
        if rec.format_version >= 2:
            # a step's gradients stay until the next zero_grad: every snapshot holds them
            assert set(snap["grads"]) == set(snap["model"])
            assert rec.meta["objects"]["style"] == "positional"
            assert rec.read_step(8)["values"] is None

"""Two writers on one path (issue 23): the second refuses, naming the first; the first's file
is left alone; once the first closes (or dies), the path is free again."""

from __future__ import annotations

import os

import h5py
import pytest

from replay.store.reader import open_recording
from replay.store.writer import RecordingLocked, RingSpec, StoreWriter, lock_path


def _writer(path: str, run_id: str, pid: int) -> StoreWriter:
    return StoreWriter(
        path,
        run_id=run_id,
        meta={"env": {"pid": pid, "hostname": "h"}, "config": {}},
        sources={},
        steps=RingSpec(4, 4096, 4096),
        snapshots=RingSpec(2, 4096, 4096),
        health_slots=8,
    )


def test_a_second_writer_refuses_and_names_the_first(tmp_path):
    path = str(tmp_path / "run.h5")
    first = _writer(path, "a" * 32, pid=4242)
    try:
        assert os.path.exists(lock_path(path))
        with pytest.raises(RecordingLocked) as e:
            _writer(path, "b" * 32, pid=99)  # flock: another open file description conflicts
        msg = str(e.value)
        assert "process 4242" in msg and f"writer process {os.getpid()}" in msg and path in msg
        with h5py.File(path, "r", swmr=True) as f:  # not replaced: still the first run
            assert f.attrs["run_id"] == "a" * 32
        assert not os.path.exists(path + ".creating")
    finally:
        first.close()
    assert not os.path.exists(lock_path(path))  # a clean close leaves nothing beside the file
    second = _writer(path, "c" * 32, pid=7)
    second.close()
    with open_recording(path) as rec:
        assert rec.run_id == "c" * 32


def test_a_stale_lock_file_of_a_dead_writer_does_not_block(tmp_path):
    path = str(tmp_path / "run.h5")
    with open(lock_path(path), "w") as fh:  # what kill -9 leaves: the file, no lock on it
        fh.write('{"pid": 1, "writer_pid": 1}')
    w = _writer(path, "d" * 32, pid=5)
    w.close()
    with open_recording(path) as rec:
        assert rec.run_id == "d" * 32


def test_rings_beyond_the_readers_limits_are_refused(tmp_path):
    with pytest.raises(ValueError, match="health slots"):
        StoreWriter(
            str(tmp_path / "run.h5"),
            run_id="e" * 32,
            meta={},
            sources={},
            steps=RingSpec(4, 4096, 4096),
            snapshots=RingSpec(2, 4096, 4096),
            health_slots=1 << 30,
        )
    assert not os.path.exists(lock_path(str(tmp_path / "run.h5")))

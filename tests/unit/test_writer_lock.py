"""Two writers on one path (issue 23): the second refuses, naming the first; the first's file
is left alone; once the first closes (or dies), the path is free again."""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import pytest

from replay.errors import RecordingError
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


# A child that opens the file for writing the way StoreWriter._open does: HDF5's own lock held
# until SWMR is turned on, HOLD seconds later.
_OPENS_FOR_WRITING = """
import sys, time, h5py
f = h5py.File(sys.argv[1], "r+", libver="latest")
print("open", flush=True)
time.sleep(float(sys.argv[2]))
f.swmr_mode = True
print("swmr", flush=True)
sys.stdin.read()
"""


def _holding_writer(path: str, hold: float) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _OPENS_FOR_WRITING, path, str(hold)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "open\n"
    return child


def test_a_reader_arriving_before_the_writer_turned_swmr_on_waits_for_it(tmp_path):
    # CI (stop 55) opened a starting recorder's file in the moment between its open and SWMR:
    # "unable to lock file", where a moment later it read fine.
    path = str(tmp_path / "run.h5")
    _writer(path, "e" * 32, pid=3).close()
    child = _holding_writer(path, 0.5)
    try:
        with open_recording(path) as rec:
            assert rec.run_id == "e" * 32
    finally:
        child.communicate("", timeout=30)


def test_a_file_held_for_writing_without_swmr_is_refused_in_one_line(tmp_path, monkeypatch):
    from replay.store import reader

    monkeypatch.setattr(reader, "LOCK_WAIT_S", 0.3)
    path = str(tmp_path / "run.h5")
    _writer(path, "f" * 32, pid=3).close()
    child = _holding_writer(path, 30)
    try:
        with pytest.raises(RecordingError) as e:
            open_recording(path)
        assert "holds it open for writing" in str(e.value) and "\n" not in str(e.value)
    finally:
        child.kill()
        child.communicate(timeout=30)

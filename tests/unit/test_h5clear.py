"""A file whose SWMR writer was SIGKILLed reopens for writing once its status flags are cleared."""

from __future__ import annotations

import os
import signal
import struct

import h5py
import numpy as np
import pytest

from replay.store.h5clear import clear_status_flags, lookup3


def test_lookup3_matches_the_superblock_checksum_hdf5_wrote(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f["x"] = np.arange(3)
    sb = path.read_bytes()[:48]
    assert sb[8] in (2, 3) and sb[9] == 8
    assert struct.unpack_from("<I", sb, 44)[0] == lookup3(sb[:44])
    assert clear_status_flags(str(path)) is False  # closed properly: nothing to clear


def test_a_killed_swmr_writers_file_reopens_for_writing_after_clearing(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f["x"] = np.arange(3)
    pid = os.fork()
    if pid == 0:  # a writer in SWMR mode, killed without closing
        f = h5py.File(path, "r+", libver="latest")
        f.swmr_mode = True
        f["x"][0] = 7
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(path, "r+", libver="latest")
    assert clear_status_flags(str(path)) is True
    with h5py.File(path, "r+", libver="latest") as f:
        f.swmr_mode = True
        assert list(f["x"][:]) == [7, 1, 2]


def test_a_superblock_with_a_wrong_checksum_is_left_alone(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f["x"] = np.arange(3)
    raw = bytearray(path.read_bytes())
    raw[11] = 5  # flags set, checksum not updated
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        clear_status_flags(str(path))
    assert path.read_bytes()[11] == 5

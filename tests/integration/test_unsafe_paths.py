"""Never write through anything but a regular file the recorder created (issue 32, item 2).

As root, ``replay preflight --keep /dev/full`` replaced the machine's ``/dev/full`` with an HDF5
file, and symlinks planted at ``RUN.h5.lock`` and ``RUN.h5.creating`` had their victim file
overwritten. Every node here is a private one, made in the test's own temporary folder."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from tests.conftest import SCRIPTS, replay_here, run_py


def _make_node(path: str, kind: str) -> socket.socket | None:
    if kind == "chardev":  # the numbers of /dev/full, on a node of our own
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        return s
    return None


def _train(out: str, steps: int = 6):
    return run_py(str(SCRIPTS / "mlp_train.py"), out, "--steps", str(steps), timeout=180)


def _warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "RecorderWarning" in ln]


@pytest.mark.parametrize("kind", ["chardev", "fifo", "socket"])
def test_recording_path_that_is_a_device_fifo_or_socket_was_replaced(tmp_path, kind):
    if kind == "chardev" and os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    out = str(tmp_path / "run.h5")
    sock = _make_node(out, kind)
    before = os.lstat(out)
    try:
        p = _train(out)
    finally:
        if sock is not None:
            sock.close()
    assert p.returncode == 0, p.stderr[-2000:]  # training went on
    warned = _warnings(p.stderr)
    assert len(warned) == 1, p.stderr[-2000:]
    assert "not a regular file" in warned[0] and "training goes on unrecorded" in warned[0]
    after = os.lstat(out)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (
        before.st_mode,
        before.st_ino,
        before.st_rdev,
    )
    assert not os.path.exists(out + ".creating")


@pytest.mark.parametrize("suffix", [".lock", ".creating"])
def test_planted_symlink_beside_the_recording_overwrote_its_victim(tmp_path, suffix):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = str(tmp_path / "run.h5")
    os.symlink(victim, out + suffix)
    p = _train(out)
    assert p.returncode == 0, p.stderr[-2000:]
    assert victim.read_text() == "precious\n"
    assert os.path.islink(out + suffix)  # neither followed nor replaced
    warned = _warnings(p.stderr)
    assert len(warned) == 1 and "symbolic link" in warned[0], p.stderr[-2000:]


def test_stale_lock_and_creating_files_of_a_killed_writer_are_reused(tmp_path):
    """What kill -9 leaves behind (regular files of our own) does not block the next run."""
    out = str(tmp_path / "run.h5")
    for suffix in (".lock", ".creating"):
        with open(out + suffix, "w") as fh:
            fh.write("{}")
    p = _train(out)
    assert p.returncode == 0 and not _warnings(p.stderr), p.stderr[-2000:]
    info = replay_here("info", out)
    assert info.returncode == 0, info.stderr
    assert not os.path.exists(out + ".creating") and not os.path.exists(out + ".lock")


def test_fifo_planted_at_the_lock_hung_info(tmp_path):
    """Reading who writes a recording opens its lock file: a FIFO there must not block it."""
    out = str(tmp_path / "run.h5")
    p = _train(out)
    assert p.returncode == 0, p.stderr[-2000:]
    os.mkfifo(out + ".lock")
    info = replay_here("info", out)
    assert info.returncode == 0, info.stderr
    assert "closed cleanly" in info.stdout

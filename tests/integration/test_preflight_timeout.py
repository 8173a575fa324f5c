"""``replay preflight --timeout`` ends the whole process group on time, and its temporary
folders go on every path (issue 32, item 5 and 10): ``--timeout 10 -- sleep 600`` ran until it
was killed at 90 s, a forked child holding stdout made ``--timeout 60`` take 125 s, and
``/tmp/replay-preflight-*`` folders were left behind after failed or timed-out preflights."""

from __future__ import annotations

import os
import stat
import sys
import time

import pytest

from tests.conftest import replay_cli, replay_here


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is dead
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


def _preflight(tmp_path, *args: str):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    t0 = time.monotonic()
    p = replay_cli("preflight", *args, timeout=120, env={"TMPDIR": str(tmpdir)})
    return p, time.monotonic() - t0, tmpdir


def test_preflight_timeout_was_ignored_by_a_silent_command(tmp_path):
    pidfile = tmp_path / "pids"
    script = f"echo $$ > {pidfile}; sleep 600 & echo $! >> {pidfile}; wait"
    p, took, tmpdir = _preflight(tmp_path, "--timeout", "3", "--", "sh", "-c", script)
    assert p.returncode == 1, p.stderr
    assert took < 30, took
    assert "--timeout 3" in p.stdout, p.stdout
    for pid in map(int, pidfile.read_text().split()):
        assert _wait_gone(pid), f"process {pid} of the run's group outlived --timeout"
    assert os.listdir(tmpdir) == []  # no replay-preflight-* folder left


def test_forked_grandchild_holding_stdout_extended_the_timeout(tmp_path):
    pidfile = tmp_path / "pid"
    code = (
        "import os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(600)\n"  # holds the inherited stdout
        "    os._exit(0)\n"
        f"open({str(pidfile)!r}, 'w').write(str(pid))\n"
        "print('parent exits', flush=True)\n"
    )
    p, took, tmpdir = _preflight(tmp_path, "--timeout", "4", "--", sys.executable, "-c", code)
    assert p.returncode == 1, p.stderr
    assert took < 30, took
    assert "parent exits" in p.stderr
    assert _wait_gone(int(pidfile.read_text())), "the forked child outlived --timeout"
    assert os.listdir(tmpdir) == []


def test_failed_preflight_left_its_temporary_folder(tmp_path):
    p, _, tmpdir = _preflight(tmp_path, "--", sys.executable, "-c", "raise SystemExit(3)")
    assert p.returncode == 1, p.stderr
    assert "exited with 3" in p.stdout, p.stdout
    assert os.listdir(tmpdir) == []


# --timeout -1 and 0, once an internal error: test_usage_errors.py's preflight_timeout_* cases.


@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_preflight_keep_on_a_fifo_or_device_replaced_it(tmp_path, kind):
    """As root, ``--keep /dev/full`` replaced the machine's /dev/full (here: a node of ours)."""
    node = tmp_path / "keep.h5"
    if kind == "FIFO":
        os.mkfifo(node)
    elif os.geteuid() == 0:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    else:
        pytest.skip("mknod of a character device needs root")
    before = os.lstat(node)
    p = replay_here("preflight", "--keep", str(node), "--", "true")  # refused before it runs
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("replay: error: --keep ") and kind in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1
    after = os.lstat(node)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (
        before.st_ino,
        before.st_mode,
        before.st_rdev,
    )

"""Folders killed replays left in the temporary directory are removed by the next one
(``store/tmpdirs.py``): a self-check ends with its run by SIGKILL, mid-replay when the run is
short, and its scratch folder stayed in /tmp for good (98 of them after a day of this suite)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from replay.store.tmpdirs import private_dir

_MAKE = "from replay.store.tmpdirs import private_dir; print(private_dir('scratch'), flush=True)"


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _made_by_a_process(root: Path, *, killed: bool) -> tuple[Path, subprocess.Popen[str]]:
    """A folder made by another process, which then waits: killed with SIGKILL, or left alive."""
    code = f"{_MAKE}; import sys; sys.stdin.read()"
    env = {**os.environ, "TMPDIR": str(root)}
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout is not None
    folder = Path(p.stdout.readline().strip())
    (folder / "checkpoint.pt").write_bytes(b"what the program wrote on its way to the Recorder")
    if killed:
        p.send_signal(signal.SIGKILL)
        p.communicate()
    return folder, p


def test_the_folder_of_a_killed_replay_is_removed_by_the_next(tmp_root: Path) -> None:
    dead, _ = _made_by_a_process(tmp_root, killed=True)
    live, p = _made_by_a_process(tmp_root, killed=False)
    try:
        mine = Path(private_dir("scratch"))
        assert not dead.exists()
        assert live.exists() and mine.exists()  # a live process's folder, and the new one
        assert mine.name.startswith("replay-scratch-") and f"-{os.getpid()}-" in mine.name
        assert oct(mine.stat().st_mode & 0o777) == "0o700"
    finally:
        p.kill()
        p.communicate()


def test_only_real_folders_of_this_user_are_removed(tmp_root: Path) -> None:
    """A name that looks like a dead replay's is left alone unless it is this user's real
    folder: another user's folder, a link planted to a victim folder, a file."""
    dead, _ = _made_by_a_process(tmp_root, killed=True)
    prefix = dead.name.rsplit("-", 1)[0]  # replay-scratch-<namespace>-<dead pid>
    victim = tmp_root / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    link = tmp_root / f"{prefix}-link"
    link.symlink_to(victim)
    plain = tmp_root / f"{prefix}-file"
    plain.write_text("not a folder")
    others = tmp_root / f"{prefix}-others"
    others.mkdir()
    if os.getuid() == 0:
        os.chown(others, 65534, 65534)  # (as root: a folder another user owns)
    private_dir("scratch")
    assert not dead.exists()
    assert link.is_symlink() and (victim / "precious").read_text() == "keep"
    assert plain.read_text() == "not a folder"
    assert others.exists() == (os.getuid() == 0)

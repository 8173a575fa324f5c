"""The command and the import boundary: bad files refused before the app starts; no torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import replay_here, run_env


def test_tui_and_store_never_import_torch():
    code = (
        "import sys, replay_tui, replay_tui.app, replay.store, replay.store.forensics, replay.cli.tui\n"
        "from replay_tui.model import RunModel\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=run_env(), timeout=60)


def test_missing_file_is_one_line_exit_3(tmp_path):
    r = replay_here("tui", str(tmp_path / "nope.h5"))
    assert r.returncode == 3
    assert r.stderr.strip().count("\n") == 0 and "no such file" in r.stderr


def test_not_a_recording_is_one_line_exit_3(tmp_path):
    p = tmp_path / "notes.h5"
    p.write_text("hello")
    r = replay_here("tui", str(p))
    assert r.returncode == 3 and "not an HDF5 file" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_real_command_in_a_terminal(runs):
    """Drive `replay tui` in tmux at 120x40: it opens on the culprit, switches views, quits."""
    name = f"replay-tui-test-{os.getpid()}"
    cmd = f"{sys.executable} -m replay tui {runs['traced']}"
    env = run_env()
    subprocess.run(
        [
            "tmux",
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            "120",
            "-y",
            "40",
            "-e",
            f"PYTHONPATH={env['PYTHONPATH']}",
            cmd,
        ],
        check=True,
        env=env,
    )

    def screen() -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-t", name, "-p"], capture_output=True, text=True
        ).stdout

    def wait_for(text: str, timeout: float = 30) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = screen()
            if text in s:
                return s
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never appeared; screen:\n{screen()}")

    try:
        wait_for("culprit #4 aten::div")
        s = wait_for("● div")  # rows arrive from a worker just after the first paint
        assert "body.0.norm" in s
        subprocess.run(["tmux", "send-keys", "-t", name, "3"], check=True)
        wait_for("Normalize")
        subprocess.run(["tmux", "send-keys", "-t", name, "1"], check=True)
        wait_for("gradient norm (log)")
        subprocess.run(["tmux", "send-keys", "-t", name, "q"], check=True)
        deadline = time.time() + 10
        while time.time() < deadline:
            alive = subprocess.run(["tmux", "has-session", "-t", name], capture_output=True)
            if alive.returncode != 0:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("q did not quit")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)

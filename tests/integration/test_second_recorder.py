"""Two Recorders on one path (issue 23): the second used to replace the first's live file
silently. Now the second says, once, which process is writing it, does not record, and trains on;
the first run's recording is complete and its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from replay.store import open_recording
from replay.store.writer import lock_path
from tests.conftest import SCRIPTS, run_env, run_py


def test_second_recorder_on_a_live_path_warns_and_leaves_the_first_alone(tmp_path):
    out = tmp_path / "run.h5"
    env = run_env()
    hold = tmp_path / "hold"  # the first trains on only once it is gone
    hold.touch()
    first = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPTS / "mlp_train.py"),
            str(out),
            "--steps",
            "150",
            "--hold",
            str(hold),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and os.path.exists(lock_path(str(out)))):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first recorder never created its file"
            time.sleep(0.1)
        with open_recording(str(out)) as rec:  # (it waits out the writer's open-to-SWMR moment)
            first_id = rec.run_id
        second = run_py(str(SCRIPTS / "mlp_train.py"), str(out), "--steps", "20", timeout=120)
        assert second.returncode == 0, second.stderr  # training went on
        warnings = [ln for ln in second.stderr.splitlines() if "RecorderWarning" in ln]
        assert len(warnings) == 1, second.stderr
        assert "being written by another recorder" in warnings[0]
        assert f"process {first.pid}" in warnings[0], warnings[0]
        assert first.poll() is None  # the first is still training (held after its first step)
    finally:
        hold.unlink(missing_ok=True)
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    with open_recording(str(out)) as rec:
        assert rec.run_id == first_id and rec.closed_cleanly
        assert rec.env["pid"] == first.pid and rec.status()["steps_total"] == 150
    assert not os.path.exists(lock_path(str(out)))

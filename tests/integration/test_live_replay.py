"""Replaying a recording while its training process is alive and writing it (issue 32, item 6):
``bisect --json`` ended in ``internal error: KeyError: 'step 300 is not in the snapshots ring'``
(3 runs of 4) and ``verify`` in "restoring the snapshot of step 1060 failed (KeyError); the
recording may be damaged", on a file that was not damaged. Both now replay the window that was
committed when they opened it, and say that the file is still being written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from replay.store.liveness import writer_state
from tests.conftest import SCRIPTS, replay_cli, run_env


def test_replaying_a_live_recording_was_an_internal_error_or_called_damaged(tmp_path):
    out = tmp_path / "live.h5"
    # Small rings that wrap many times a second: the writer overwrites what replay reads.
    writer = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPTS / "mlp_train.py"),
            str(out),
            "--steps",
            "1000000",
            "--sleep",
            "0.005",
            "--snapshot-every",
            "10",
            "--keep",
            "3",
        ],
        env=run_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not (out.exists() and writer_state(str(out)) is not None):
            assert writer.poll() is None, writer.communicate()
            assert time.monotonic() < deadline, "the writer never started"
            time.sleep(0.1)
        time.sleep(3)  # the rings have wrapped by now
        for command, code in (("verify", 0), ("bisect", 1), ("verify", 0), ("bisect", 1)):
            p = replay_cli(command, str(out), "--json", timeout=180)
            assert writer.poll() is None, "the training ended: the file is no longer live"
            assert "internal error" not in p.stderr and "may be damaged" not in p.stderr
            assert p.returncode == code, (command, p.returncode, p.stderr[-2000:])
            assert "is still being written" in p.stderr, p.stderr[-2000:]
            report = json.loads(p.stdout)
            if command == "verify":
                assert report["deterministic"] and report["replayed_steps"] >= 1, report
    finally:
        writer.terminate()
        writer.communicate(timeout=60)
    assert os.path.exists(out)

"""The overview says when a recording's training died and its writer is still committing what
training published (the lock it holds beside the file says so: replay/store/liveness.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from helpers import settle
from textual.widgets import Static

from replay.store.liveness import lock_path
from replay_tui import make_app

HOLDER = """
import fcntl, json, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": 1, "writer_pid": os.getpid(), "state": "draining",
                         "steps_to_come": 7}).encode())
print("held", flush=True)
sys.stdin.read()
os.unlink(sys.argv[1])
"""


async def test_the_overview_says_the_writer_is_still_committing(runs, tmp_path):
    run = tmp_path / "run.h5"
    shutil.copy(runs["plain"], run)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, lock_path(str(run))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        app = make_app(str(run), poll=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            overview = app.get_screen("overview")
            info = str(overview.query_one("#run-info", Static).render())
            assert "training died; its writer is still committing: 7 steps to come" in info
            holder.communicate("", timeout=10)  # the writer finishes and lets go
            assert app.model.refresh()  # the change is seen
            overview.update_from_model()
            await settle(pilot)
            info = str(overview.query_one("#run-info", Static).render())
            assert "run.h5, closed" in info and "committing" not in info
    finally:
        holder.kill()
        holder.wait()

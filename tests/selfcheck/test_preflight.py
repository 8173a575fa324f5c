"""`replay preflight` is the self-check run to completion (docs/selfcheck.md): a program that
fails within its steps is reported with that failure bisected and its recording kept; a
torchrun command is checked with its whole rank set."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tests.conftest import replay_cli

PROGRAMS = Path(__file__).parents[1] / "reentry" / "programs"


def test_a_program_that_fails_within_the_preflight_steps_is_reported_bisected_and_kept(tmp_path):
    """It said `NOT replayable: the command exited with 1` and pointed at a file it had
    already deleted."""
    shutil.copy(PROGRAMS / "trains_at_import_reentry.py", tmp_path)
    cmd = [sys.executable, "trains_at_import_reentry.py", "2"]  # NaN in step 2's batch
    p = replay_cli("preflight", "--json", "--", *cmd, cwd=tmp_path, timeout=400)
    assert p.returncode == 1, p.stderr[-3000:]
    d = json.loads(p.stdout)
    assert d["run_exit"] == 1 and "failed at step 2" in d["reason"]
    f = d["failure"]
    assert f["first_bad_step"] == 2 and f["cause"] == "data" and f["samples"] == [2], f
    kept = Path(d["recording"])
    assert kept.parent == tmp_path and kept.name.startswith("replay-preflight-") and kept.exists()
    assert kept.with_name(kept.stem + ".forensics.h5").exists()
    text = replay_cli("preflight", "--", *cmd, cwd=tmp_path, timeout=400)
    assert "verdict       FAILED: the run failed at step 2" in text.stdout, text.stdout
    assert "replays       yes, bitwise" in text.stdout and str(tmp_path) in text.stdout


def test_a_torchrun_command_is_checked_with_its_whole_rank_set(tmp_path):
    """Under torchrun it said `the command created no replay.Recorder` (each rank wrote its
    own preflight.rank<N>.h5)."""
    shutil.copy(PROGRAMS / "ddp_torchrun.py", tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    p = replay_cli(
        "preflight",
        "--json",
        "--",
        *cmd,
        "ddp_torchrun.py",
        "--steps",
        "20",
        cwd=tmp_path,
        timeout=400,
    )
    assert p.returncode == 0, (p.stdout, p.stderr[-3000:])
    d = json.loads(p.stdout)
    assert d["replayable"] is True and d["ranks"] == 2 and d["replayed_steps"] == 8, d
    assert not list(tmp_path.glob("*.h5"))  # nothing kept: it replayed

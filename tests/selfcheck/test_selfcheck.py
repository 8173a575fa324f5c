"""The background self-check (docs/selfcheck.md): while a run trains, a child process replays
its first steps; a recording that cannot replay says so on the training's stderr at once, and
the verdict is in `replay info`. Real runs, real child processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay.store.selfcheck import SelfCheck, read_selfcheck, selfcheck_path, write_selfcheck
from tests.conftest import replay_here_json, run_env

PROGRAM = Path(__file__).with_name("programs") / "train_until_checked.py"


def train(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the program with the self-check on, stdout and stderr in one stream, in order."""
    shutil.copy(PROGRAM, tmp)
    # nice 0, not 19: the suite's two workers keep both cores busy, and a nice-19 check then
    # ran past the program's deadline (a run of the whole suite failed so); at 10 it had a
    # tenth of a core, and these runs, which train until its verdict, took 7-10 s each
    env = {**run_env(), "REPLAY_SELF_CHECK": "1", "REPLAY_SELF_CHECK_NICE": "0"}
    return subprocess.run(
        [sys.executable, str(tmp / PROGRAM.name), *args],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=420,
    )


@pytest.mark.slow
def test_a_global_the_loop_changes_is_flagged_on_stderr_while_the_run_trains(tmp_path):
    p = train(tmp_path, "--global-lr")
    assert p.returncode == 0, p.stdout[-3000:]
    lines = p.stdout.splitlines()
    warn = [i for i, ln in enumerate(lines) if "does NOT replay" in ln]
    ended = [i for i, ln in enumerate(lines) if ln.startswith("training ended")]
    assert len(warn) == 1 and ended and warn[0] < ended[0], p.stdout[-3000:]
    assert "outside_state" in lines[warn[0]] and "training goes on" in lines[warn[0]]
    rc, d, err = replay_here_json("info", str(tmp_path / "run.h5"))
    assert rc == 0, err
    check = d["self_check"]
    assert check["status"] == "failed" and check["kind"] == "outside_state"
    assert check["check"] == "bitwise on cpu" and check["steps"][1] - check["steps"][0] == 3
    text = subprocess.run(
        [sys.executable, "-m", "replay", "info", str(tmp_path / "run.h5")],
        env=run_env(),
        capture_output=True,
        text=True,
    ).stdout
    assert "self-check      does NOT replay" in text


def test_a_batch_the_previous_step_prefetched_into_a_global_is_flagged(tmp_path):
    """nanoGPT's loop: the step trains on the batch the step before it fetched. A replay carried
    on from the first snapshot rebuilds that batch; a bisect of a later failure starts from a
    later snapshot and cannot. The check replays its last steps from a snapshot of their own."""
    p = train(tmp_path, "--prefetch")
    assert p.returncode == 0, p.stdout[-3000:]
    warn = [ln for ln in p.stdout.splitlines() if "does NOT replay" in ln]
    assert len(warn) == 1, p.stdout[-3000:]
    # From the run's first snapshot the check names it (the replay carried on to step 2 matches,
    # the one from step 2's snapshot does not); from a later one (a loaded machine's check
    # started after a fast run's ring moved on) the first replayed step already differs, and
    # the line names the global it prefetches into as a batch to hand to the step.
    assert (
        "not from the snapshot of step 2" in warn[0]
        or "prefetches into a global" in warn[0]
        or "(a batch it prefetched: as the batch)" in warn[0]
    ), warn[0]
    assert "rec.step(batch, name=value)" in warn[0], warn[0]
    # and what it is: the global the step rebinds (replay/capture/suspects.py)
    assert "NEXT[0] (tensor float32[16, 16]" in warn[0], warn[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape", [[], ["--workers", "2"], ["--amp"]], ids=["plain", "workers", "amp"]
)
def test_healthy_runs_are_not_flagged(tmp_path, shape):
    """Dropout, shuffling, DataLoader worker processes, bf16 autocast: no false alarm."""
    p = train(tmp_path, *shape)
    assert p.returncode == 0, p.stdout[-3000:]
    assert "does NOT replay" not in p.stdout and "self-check" not in p.stdout
    v = read_selfcheck(str(tmp_path / "run.h5"))
    assert v is not None and v.status == "ok" and v.check == "bitwise on cpu", (v, p.stdout[-2000:])


def test_once_the_first_steps_replay_steps_from_a_later_snapshot_are_checked_too(tmp_path):
    """The first steps of a run can replay while a snapshot taken once training is under way
    does not (a DQN step that returns at once while its memory fills: tests/realistic). The
    same child, once the first steps replay, waits for the snapshot at keep_snapshots x
    snapshot_every (step 30 here) and replays from it."""
    p = train(tmp_path, "--later")
    assert p.returncode == 0, p.stdout[-3000:]
    assert "does NOT replay" not in p.stdout
    v = read_selfcheck(str(tmp_path / "run.h5"))
    assert v is not None and v.status == "ok", (v, p.stdout[-2000:])
    # from step 30's snapshot, or (the ring moved on while the check re-ran the program) from
    # the oldest kept after it
    first = v.steps[0] if v.steps else -1
    if v.earlier is None:  # the first check itself started past step 30 (a loaded machine)
        assert first >= 30 and first % 10 == 0, v
        return
    assert v.earlier == (0, 3) and first >= 30 and first % 10 == 0, v
    # four steps from the snapshot, fewer where the run ended sooner (a check that started late
    # on a loaded machine, at the last snapshot: (480, 480) under make test-all's coverage)
    last = v.steps[1]
    assert first <= last <= first + 3 and v.check == "bitwise on cpu", v
    rc, d, _ = replay_here_json("info", str(tmp_path / "run.h5"))
    assert d["self_check"]["earlier"] == [0, 3] and d["self_check"]["steps"] == list(v.steps)
    assert v.line() == (
        "replays: the self-check replayed the first steps (0..3) and, from a later snapshot, "
        f"steps {first}..{last} bitwise on cpu"
    )


def test_a_state_over_the_budget_says_it_skipped_the_check_and_why(tmp_path):
    p = train(tmp_path, "--budget", "1000")
    assert p.returncode == 0, p.stdout[-3000:]
    v = read_selfcheck(str(tmp_path / "run.h5"))
    assert v is not None and v.status == "skipped", v
    assert "over the self-check's budget" in v.summary and "replay preflight" in v.summary
    rc, d, _ = replay_here_json("info", str(tmp_path / "run.h5"))
    assert d["self_check"]["status"] == "skipped"


def test_a_verdict_file_is_untrusted_input(tmp_path):
    """What info reads beside a recording: garbage, a huge file, a FIFO, a link are no verdict."""
    import os

    run = str(tmp_path / "run.h5")
    path = Path(selfcheck_path(run))
    for junk in (b"not json", b'{"status": "maybe"}', b"[1, 2]", b"{" * 100_000):
        path.write_bytes(junk)
        assert read_selfcheck(run) is None
    path.unlink()
    os.mkfifo(path)
    assert read_selfcheck(run) is None  # and it did not block
    path.unlink()
    (tmp_path / "victim").write_text('{"status": "ok"}')
    path.symlink_to(tmp_path / "victim")
    assert read_selfcheck(run) is None
    path.unlink()
    write_selfcheck(run, SelfCheck("failed", "bitwise on cpu", (0, 3), "raised", "x\x1b[2J"))
    v = read_selfcheck(run)
    assert v is not None and v.failed and v.steps == (0, 3) and v.kind == "raised"
    assert json.loads(path.read_text())["version"] == 4
    for junk in ([30], [30, "33"], [True, 33], "30..33"):  # an earlier span that is not one
        path.write_text(json.dumps({"status": "ok", "steps": [30, 33], "earlier": junk}))
        v = read_selfcheck(run)
        assert v is not None and v.earlier is None and v.steps == (30, 33)


def test_a_run_that_ends_before_its_check_says_that_its_replay_is_not_proven(tmp_path):
    """Was: a run shorter than its check (a 20-step CLIP run whose check, at the lowest
    priority, had no core while training kept both busy) ended in silence, its recording
    never proven, as a proven one does. It now says so at close, with the command that checks."""
    p = train(tmp_path, "--stop-at", "6")
    assert p.returncode == 0, p.stdout[-3000:]
    said = [ln for ln in p.stdout.splitlines() if "had not finished" in ln]
    assert len(said) == 1 and f"replay verify {tmp_path / 'run.h5'}" in said[0], p.stdout[-3000:]
    assert "does NOT replay" not in p.stdout
    # a run that failed is told to bisect, which checks that it replays: nothing more to say
    (tmp_path / "run.h5").unlink()
    p = train(tmp_path, "--stop-at", "8", "--nan-at", "6")
    assert p.returncode != 0 and "loss is nan at step 6" in p.stdout, p.stdout[-3000:]
    assert "had not finished" not in p.stdout


def test_a_check_whose_run_ended_before_its_steps_does_not_outlive_it(tmp_path):
    """Was: a run that ended (or died) before the steps to check reached its file left the
    check waiting its full 300 s, an orphan holding the run's stderr: ``subprocess.run`` of
    such a run blocked for five minutes after it returned. The check now ends with the
    training process that started it (the kernel's parent-death signal), and says nothing."""
    run = tmp_path / "run.h5"
    parent = (
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-m', 'replay.workflows.selfcheck', sys.argv[1],\n"
        "                  '--after', '3', '--steps', '4', '--training-pid', str(os.getpid())])\n"
        "time.sleep(1)\n"
    )
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", parent, str(run)],
        env=run_env(),
        capture_output=True,  # the check inherits these pipes: run() returns once it exits
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 30
    v = read_selfcheck(str(run))
    assert v is None or v.status == "error", v
    assert "does NOT replay" not in p.stderr


def test_a_verdict_left_by_an_earlier_recording_at_the_same_path_is_not_this_ones(
    tmp_path, mlp_nan_run, capsys
):
    """Was: run.selfcheck.json outlives its recording. A run recorded again at the same path
    (the old run.h5 deleted) with the check off was shown the old run's "does NOT replay" by
    info, bisect and the TUI. A verdict names its run; one naming another is not shown."""
    from replay.cli.bisect import _quote_self_check
    from replay.store.reader import open_recording

    run = tmp_path / "run.h5"
    shutil.copy(mlp_nan_run, run)
    with open_recording(str(run), health_only=True) as rec:
        own = rec.run_id
    old = SelfCheck("failed", "bitwise on cpu", (0, 3), "raised", "old run", run_id="0" * 32)
    write_selfcheck(str(run), old)
    rc, d, err = replay_here_json("info", str(run))
    assert rc == 0 and d["self_check"] is None, err
    _quote_self_check(str(run))
    assert "does NOT replay" not in capsys.readouterr().err
    write_selfcheck(str(run), SelfCheck("failed", "bitwise on cpu", (0, 3), "raised", "this run",
                                        run_id=own))  # fmt: skip
    rc, d, _ = replay_here_json("info", str(run))
    assert d["self_check"]["summary"] == "this run" and d["self_check"]["run_id"] == own
    _quote_self_check(str(run))
    assert "does NOT replay: the self-check (steps 0..3) found raised: this run" in (
        capsys.readouterr().err
    )
    # a verdict naming no run (version 1, or planted) proves nothing of this one: not shown
    Path(selfcheck_path(str(run))).write_text('{"version": 1, "status": "ok", "steps": [0, 3]}')
    rc, d, _ = replay_here_json("info", str(run))
    assert d["self_check"] is None

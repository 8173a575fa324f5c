"""Resumed runs never destroy a recording (issue 31, item 4). A run resumed from a checkpoint
into the same path used to replace the crashed run's recording without a word; Lightning
numbered the resumed steps from 0. Now the resumed run records into the next free segment
(``run.1.h5``, ``run.2.h5``, ...) with a one-line notice naming it, keeps the global step
numbers, and ``replay info`` names the other segments. Each segment replays on its own.
"""

from __future__ import annotations

import h5py
import pytest

from replay.store import open_recording
from tests.conftest import ROOT, SCRIPTS, replay_cli, replay_json, run_py

INTEGRATIONS = ROOT / "tests" / "integrations" / "scripts"


def _run_id(path):
    with h5py.File(path, "r") as f:
        return str(f.attrs["run_id"])


def _health_steps(path):
    with open_recording(path) as r:
        return [int(s) for s in r.health()["step"]]


def _check_resumed(tmp_path, first, resumed, first_steps, resumed_steps, resume_stderr):
    assert _health_steps(first) == first_steps
    assert _health_steps(resumed) == resumed_steps
    notice = [ln for ln in resume_stderr.splitlines() if "holds an earlier recording" in ln]
    assert notice == [
        f"replay: {first} holds an earlier recording, kept; this run records to {resumed}"
    ]
    info = replay_cli("info", str(first), cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert f"other segment   {resumed} (steps {resumed_steps[0]}..{resumed_steps[-1]})" in (
        info.stdout
    )
    rc, d, err = replay_json("info", str(resumed), cwd=tmp_path)
    assert rc == 0, err
    assert d["segments"] == [
        {"path": str(first), "health_steps": [first_steps[0], first_steps[-1]]}
    ]
    rc, d, err = replay_json("verify", str(resumed), cwd=tmp_path)
    assert rc == 0, err
    assert d["deterministic"] is True
    assert d["window"] == [resumed_steps[0], resumed_steps[-1]]


@pytest.mark.slow
def test_a_resumed_plain_loop_keeps_the_first_recording_and_its_step_numbers(tmp_path):
    script = str(SCRIPTS / "resume_train.py")
    run, ckpt = tmp_path / "run.h5", str(tmp_path / "ckpt.pt")
    run_py(script, str(run), ckpt, "first", check=True, cwd=tmp_path)
    first_id = _run_id(run)
    p = run_py(script, str(run), ckpt, "resume", check=True, cwd=tmp_path)
    assert _run_id(run) == first_id  # the first recording, untouched
    _check_resumed(
        tmp_path, run, tmp_path / "run.1.h5", list(range(10)), list(range(10, 20)), p.stderr
    )
    # A second resume goes on to the next free segment.
    p = run_py(script, str(run), ckpt, "resume", check=True, cwd=tmp_path)
    assert f"this run records to {tmp_path / 'run.2.h5'}" in p.stderr
    assert _health_steps(tmp_path / "run.2.h5") == list(range(20, 30))
    assert _run_id(run) == first_id


@pytest.mark.slow
def test_a_lightning_fit_from_a_checkpoint_numbers_from_its_global_step(tmp_path):
    pytest.importorskip("lightning")
    script = str(INTEGRATIONS / "lightning_resume.py")
    first = run_py(script, str(tmp_path), "first", check=True, timeout=180, cwd=tmp_path)
    assert "global_step 12" in first.stdout
    run = tmp_path / "run.h5"
    first_id = _run_id(run)
    p = run_py(script, str(tmp_path), "resume", check=True, timeout=180, cwd=tmp_path)
    assert "global_step 24" in p.stdout
    assert _run_id(run) == first_id
    _check_resumed(
        tmp_path, run, tmp_path / "run.1.h5", list(range(12)), list(range(12, 24)), p.stderr
    )


@pytest.mark.slow
def test_a_hugging_face_resume_keeps_the_checkpoint_step_numbers(tmp_path):
    pytest.importorskip("transformers")
    script = str(INTEGRATIONS / "hf_resume.py")
    first = run_py(script, str(tmp_path), "first", check=True, timeout=180, cwd=tmp_path)
    assert "global_step 6" in first.stdout
    run = tmp_path / "run.h5"
    first_id = _run_id(run)
    p = run_py(script, str(tmp_path), "resume", check=True, timeout=180, cwd=tmp_path)
    assert "global_step 12" in p.stdout
    assert _run_id(run) == first_id
    # Step t is the optimisation step that makes global_step t + 1: 0..5, then 6..11.
    _check_resumed(
        tmp_path, run, tmp_path / "run.1.h5", list(range(6)), list(range(6, 12)), p.stderr
    )


@pytest.mark.slow
def test_a_run_restarted_while_the_crashed_one_still_drains_records_its_own_segment(tmp_path):
    """The crashed run's writer process is still committing its last steps (its lock says
    ``draining``): the restarted run is no second recorder of a live run, and records."""
    from tests.integration.test_draining_writer import _end, _hold

    script = str(SCRIPTS / "resume_train.py")
    run, ckpt = tmp_path / "run.h5", str(tmp_path / "ckpt.pt")
    run_py(script, str(run), ckpt, "first", check=True, cwd=tmp_path)
    holder = _hold(run, 120)
    try:
        p = run_py(script, str(run), ckpt, "resume", check=True, cwd=tmp_path)
    finally:
        _end(holder)
    assert "RecorderWarning" not in p.stderr, p.stderr
    assert f"this run records to {tmp_path / 'run.1.h5'}" in p.stderr
    assert _health_steps(tmp_path / "run.1.h5") == list(range(10, 20))
    assert _health_steps(run) == list(range(10))


@pytest.mark.slow
def test_a_failure_right_after_the_segment_boundary_is_bisected_from_the_first_segments_name(
    tmp_path,
):
    """Steps 0..9 in run.h5, healthy; the resumed run's first step (10, in run.1.h5) makes a
    NaN. ``replay bisect run.h5``, the name the user gave the Recorder, said the window was
    healthy (exit 1). It bisects the later segment that shows the failure, says so, and names
    step 10 and its op, reproducible; the resumed segment verifies bitwise from its first
    snapshot, and verify of run.h5 names the segment the run goes on in."""
    script = str(SCRIPTS / "resume_train.py")
    run, ckpt, resumed = tmp_path / "run.h5", str(tmp_path / "ckpt.pt"), tmp_path / "run.1.h5"
    run_py(script, str(run), ckpt, "first", check=True, cwd=tmp_path)
    p = run_py(script, str(run), ckpt, "resume", "--bad-step", "10", cwd=tmp_path)
    assert p.returncode != 0 and "NonFiniteLossError" in p.stderr, p.stderr[-3000:]
    assert _health_steps(resumed) == [10]
    rc, v, err = replay_json("bisect", str(run), cwd=tmp_path)
    assert rc == 0, err[-3000:]
    assert v["first_bad_step"] == 10 and v["op"] == "aten::log", v
    assert v["reproducible"] is True and v["deterministic"] is True, v
    assert v["recording"] == str(resumed), v
    moved = f"{run} is healthy; the run was resumed into {resumed}, whose recording first "
    assert any(n.startswith(moved) for n in v["notes"]), v["notes"]
    said = replay_cli("bisect", str(run), "--no-trace", cwd=tmp_path)
    assert said.returncode == 0 and moved in said.stderr, said.stderr[-3000:]
    rc, d, err = replay_json("verify", str(resumed), cwd=tmp_path)
    assert rc == 0 and d["deterministic"] is True and d["window"] == [10, 10], (d, err[-3000:])
    rc, d, err = replay_json("verify", str(run), cwd=tmp_path)
    assert rc == 0 and d["deterministic"] is True and d["window"] == [0, 9], (d, err[-3000:])
    assert f"the run goes on in {resumed} (resumed)" in " ".join(d["notes"]), d

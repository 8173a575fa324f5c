"""State the step reads that the Recorder was not given: said while the run trains when the
steps change it, and not when they cannot (distill_teacher.py).

Was: a distillation run (a frozen teacher in eval mode, read under ``no_grad``, left out of
``objects=`` as users write it) was warned at ``Recorder()`` that "no snapshot holds it, so a
replay cannot start from one", and every replay from a later snapshot was bitwise: the replay
runs the program again, which loads the teacher as it was. A warning that is wrong for the most
common case teaches users to ignore it.
"""

from __future__ import annotations

import json

from tests.realistic.test_real_programs import record, replay

HELD = "the Recorder does not hold"


def test_a_frozen_teacher_is_not_said_and_every_snapshot_replays_bitwise(tmp_path, elsewhere):
    run, p = record(tmp_path, "distill_teacher.py", "run.h5", "--steps", "60")
    assert p.returncode == 0, p.stderr[-2000:]
    assert HELD not in p.stderr, p.stderr[-2000:]
    v = replay("verify", str(run), "--all", "--json", cwd=elsewhere)
    assert v.returncode == 0, v.stderr[-2000:]
    d = json.loads(v.stdout)
    # --all: each step from the latest snapshot before it, step 50's among them (the next
    # test shows that one is where a changed teacher differs)
    assert d["deterministic"] is True and d["window"] == [0, 59], d


def test_a_frozen_module_the_steps_change_is_said_at_the_step_before_its_first_snapshot(
    tmp_path, elsewhere
):
    """An EMA kept in a frozen copy, updated under no_grad: nothing is said at Recorder(), and
    at step 50 (before the first snapshot after the start) it is, at the line of rec.step."""
    run, p = record(tmp_path, "distill_teacher.py", "run.h5", "--steps", "60", "--ema")
    assert p.returncode == 0, p.stderr[-2000:]
    said = [ln for ln in p.stderr.splitlines() if HELD in ln]
    assert len(said) == 1, p.stderr[-2000:]
    assert "teacher (Sequential, read by main.<locals>.train_step)" in said[0]
    assert "its parameters do not train, but the steps changed it" in said[0]
    assert "distill_teacher.py:74:" in said[0]  # rec.step's line, not the Recorder's
    v = replay("verify", str(run), "--all", "--json", cwd=elsewhere)
    d = json.loads(v.stdout)
    assert d["deterministic"] is False, d  # as said: the replay from step 50 starts wrong
    assert (d["first_divergence"]["step"], d["cause"]["kind"]) == (50, "outside_state"), d
    assert d["cause"]["suspects"] == ["teacher (Sequential, read by main.<locals>.train_step)"]

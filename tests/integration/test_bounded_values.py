"""Hostile per-step values (issue 31, item 5): ``rec.step(batch, t=<a tuple nested 2000 deep>)``
killed training with a RecursionError; ``xs=list(range(2_000_000))`` made every step take
seconds and the file grow by tens of MB a step. A value beyond ``VALUE_LIMITS`` is recorded as
left out, with one RecorderWarning the first time; training goes on.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from replay.capture.bounded import VALUE_LIMITS, is_unrecorded, value_excess
from replay.store import open_recording
from tests.conftest import SCRIPTS, replay_json, run_py

SCRIPT = SCRIPTS / "hostile_values.py"


def _nested(depth):
    """Tuples ``depth`` levels deep (the innermost is ``()``)."""
    v = ()
    for _ in range(depth - 1):
        v = (v,)
    return v


def test_the_limits_and_their_edges():
    d = VALUE_LIMITS["depth"]
    assert value_excess(_nested(d)) is None
    assert value_excess(_nested(d + 1)) == f"nested more than {d} levels deep"
    assert value_excess(_nested(2000)) is not None  # never recursion
    n = VALUE_LIMITS["leaves"]
    assert value_excess(list(range(n))) is None
    assert value_excess(list(range(n + 1))) == f"more than {n} elements"
    assert value_excess({i: i for i in range(n + 1)}) is not None
    assert value_excess([[0] * 100] * (n // 100 + 1)) is not None  # counted across lists
    mb = VALUE_LIMITS["bytes"]
    assert value_excess(torch.zeros(mb // 4, dtype=torch.float32)) is None
    assert value_excess(np.zeros(mb + 1, np.uint8)) == f"more than {mb >> 20} MiB"
    assert value_excess(0.1) is None and value_excess("x" * 100) is None


def test_hostile_values_do_not_stop_training_and_the_file_reads(tmp_path):
    run = tmp_path / "run.h5"
    p = run_py(str(SCRIPT), str(run), "both", "--steps", "12", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "RecursionError" not in p.stderr
    assert "final loss" in p.stdout
    # One warning per value, the first time only.
    assert p.stderr.count("RecorderWarning: replay: the per-step value 't' (tuple)") == 1
    assert p.stderr.count("RecorderWarning: replay: the per-step value 'xs' (list)") == 1
    assert "nested more than 32 levels deep" in p.stderr
    assert "more than 10000 elements" in p.stderr
    with open_recording(run) as r:
        assert [int(s) for s in r.steps()] == list(range(12))
        for i in range(12):
            values = r.read_step(i)["values"]
            assert is_unrecorded(values["t"]) == "tuple nested more than 32 levels deep"
            assert is_unrecorded(values["xs"]) == "list more than 10000 elements"
            assert values["it"] == i and values["lr"] == 0.01
    # Bounded: nothing of the two million elements reached the file (about 16 MB each step).
    assert os.path.getsize(run) < 4 << 20
    # The step function does not take them: the run replays bitwise.
    rc, d, err = replay_json("verify", str(run), cwd=tmp_path)
    assert rc == 0, err
    assert d["deterministic"] is True and d["replayed_steps"] == 12


def test_a_replay_whose_step_takes_a_left_out_value_refuses_with_the_reason(tmp_path):
    run = tmp_path / "run.h5"
    p = run_py(str(SCRIPT), str(run), "deep", "--steps", "6", "--taken", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rc, _, err = replay_json("verify", str(run), cwd=tmp_path)
    assert rc != 0
    assert "the per-step value 't' the step function takes was not recorded" in err
    assert "Traceback" not in err

"""A program that hands its step another function, or the same code over other objects, part-way
through (mnist_forward_forward: each layer trains inside its own ``train()``, a closure over
that layer). The recorder warned while the run trained; verify, weeks later, said only "two
replays agree but not with the recording: the step read something replay does not restore", as
if an object were missing from ``objects=``. The step record now keeps where the step function
changed (format.md: ``step_fn``), and verify names that step and function as the cause."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn as nn

import replay
from replay.store import open_recording
from tests.conftest import replay_cli
from tests.realistic.test_real_programs import record, verify_json


def _phases(path: str, rows: int) -> list:
    a, b = nn.Linear(4, 1), nn.Linear(4, 1)
    opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)

    def phase(layer):
        def step(x):
            opt.zero_grad()
            loss = layer(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        return step

    with warnings.catch_warnings(record=True):  # (no program to run again: not replayable)
        warnings.simplefilter("always")
        rec = replay.Recorder(
            path,
            objects={"model": nn.ModuleList([a, b]), "optimizer": opt},
            self_check=False,
            handle_signals=False,
        )
        for t in range(5):
            rec.step(torch.randn(rows, 4), phase(a if t < 2 else b))
        rec.step(torch.randn(rows, 4), lambda x: a(x).sum())  # another function
        rec.step(torch.randn(rows, 4), phase(a))  # back to the first code: a change again
        rec.step(torch.randn(rows, 4), phase(b))  # and over another layer once more
    rec.close()
    with open_recording(path) as r:
        return [r.read_step(t).get("step_fn") for t in range(8)]


# 8 rows: the record goes through the step log; 3.3M rows (53 MB, over half the 64 MiB log):
# through the writer thread
@pytest.mark.parametrize("rows", [8, 3_300_000], ids=["step_log", "writer_thread"])
def test_the_step_where_the_step_function_changed_is_in_its_record(tmp_path, rows):
    got = _phases(str(tmp_path / "run.h5"), rows)
    over = {
        "qualname": "_phases.<locals>.phase.<locals>.step",
        "over": "layer",
        # how a replay makes it again: the first closure's code over the model's layer 1
        "remake": {"cells": {"layer": {"object": "model.1"}}},
    }
    # the same code over another layer at step 2; another function at step 5, a lambda of
    # the test's own (no replay could take it from a module: kept as changed, not remade)
    assert got[:5] == [None, None, over, None, None], got
    assert got[5]["over"] is None and got[5]["qualname"].endswith("<lambda>"), got
    assert "remake" not in got[5], got
    # every change is kept, not only the first one said (a bisect of a later phase names its own)
    back = {**over, "over": None, "remake": {"cells": {}}}
    assert got[6] == back and got[7] == over, got


def test_verify_names_the_step_whose_closure_changed_as_the_cause(tmp_path, elsewhere):
    """A change a replay cannot make again (a nested helper over another layer): said while
    it trains, and verify names the step and the function, not missing objects."""
    run, p = record(tmp_path, "nested_phases.py", "3")
    said = [ln for ln in p.stderr.splitlines() if "than the step before" in ln]
    assert p.returncode == 0 and len(said) == 1, p.stderr[-2000:]
    assert "step 3 was handed make_step.<locals>.step over another forward.layer" in said[0], said
    rc, v, err = verify_json(run, elsewhere)
    assert rc == 1 and v["first_divergence"]["step"] == 3, (v.get("first_divergence"), err)
    cause = v["cause"]
    assert cause["kind"] == "outside_state", cause
    assert cause["summary"].startswith(
        "step 3 was handed make_step.<locals>.step over another forward.layer than the step before"
    ), cause
    assert "rec.step(batch, name=value)" in cause["hint"], cause


@pytest.mark.parametrize(
    "fn", ["step", {"qualname": 3, "over": None}, {"qualname": "f", "over": 1}, {"over": "x"}]
)
def test_a_malformed_step_fn_in_a_crafted_record_is_refused(fn):
    import numpy as np

    from replay.errors import RecordingError
    from replay.store.validate import check_record

    rec = {"step": 3, "rng": {}, "hparams": [], "modes": np.ones(2, bool), "step_fn": fn}
    with pytest.raises(RecordingError, match="step_fn"):
        check_record(rec, "steps", 3, "run.h5")


def test_a_loop_alternating_two_step_functions_of_its_file_replays_bitwise(tmp_path, elsewhere):
    """train_d on even steps, train_g on odd ones. Was: every step replayed as train_d (the
    program's first), and the recorder said so; now train_g is taken from the program's own
    module by name, from every snapshot (4 and 8 start on train_d, repeating train_g's record)."""
    run, p = record(tmp_path, "alternating_steps.py", "12")
    assert p.returncode == 0 and "RecorderWarning" not in p.stderr, p.stderr[-2000:]
    rc, v, err = verify_json(run, elsewhere)
    assert rc == 0 and v["deterministic"] is True and v["replayed_steps"] == 12, v.get("cause")
    p = replay_cli("verify", str(run), "--all", "--json", cwd=elsewhere)
    assert p.returncode == 0 and json.loads(p.stdout)["deterministic"] is True, p.stderr[-2000:]

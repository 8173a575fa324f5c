"""Closure optimizers (issue 31, item 2): ``optimizer.step(closure)`` runs several forward and
backward passes in one step (LBFGS). The gradient norm was taken in the optimizer's pre-hook,
before the closure ran: the last step's gradients, or none at the first step. It is now taken
right after the closure's first call; the run records and replays bitwise, and a diverging run
is bisected to the step where it went bad.
"""

from __future__ import annotations

import json
import math

from replay.store import open_recording
from tests.conftest import SCRIPTS, replay_json, run_py

SCRIPT = SCRIPTS / "lbfgs_train.py"


def _plain(*args):
    return json.loads(run_py(str(SCRIPT), "--plain", *args, check=True).stdout)


def test_a_healthy_lbfgs_run_replays_bitwise_with_its_norms_before_the_update(tmp_path):
    truth = _plain("--steps", "10")
    assert all(r["closure_calls"] > 1 for r in truth)  # several passes in every step
    run = tmp_path / "lbfgs.h5"
    run_py(str(SCRIPT), str(run), "--steps", "10", check=True, cwd=tmp_path)
    with open_recording(run) as r:
        h = r.health()
    assert list(h["optimizer_stepped"]) == [1.0] * 10
    # The norm of the gradients the step's first closure call made (not the last step's).
    for rec, want in zip(h["grad_norm"], truth, strict=True):
        assert math.isclose(rec, want["first_grad_norm"], rel_tol=1e-12), (rec, want)
    rc, d, err = replay_json("verify", str(run), cwd=tmp_path)
    assert rc == 0, err
    assert d["deterministic"] is True and d["first_divergence"] is None
    assert d["replayed_steps"] == 10
    assert all(s["match"] and s["compared"] for s in d["steps"])


def test_an_lbfgs_run_with_lr_1e200_is_bisected_to_the_step_it_went_bad(tmp_path):
    truth = _plain("--steps", "5", "--lr", "1e200")
    bad = next(
        r["step"]
        for r in truth
        if not (r["loss_finite"] and r["first_grads_finite"] and r["params_finite"])
    )
    first_loss = next(r["step"] for r in truth if not r["loss_finite"])
    run = tmp_path / "lbfgs.h5"
    p = run_py(str(SCRIPT), str(run), "--lr", "1e200", cwd=tmp_path)
    assert "NonFiniteLossError" in p.stderr
    rc, d, err = replay_json("bisect", str(run), cwd=tmp_path)
    assert rc == 0, err
    assert d["first_bad_step"] == bad
    assert d["symptom_step"] == first_loss
    assert d["deterministic"] is True and d["reproducible"] is True
    assert d["cause"] == "op"

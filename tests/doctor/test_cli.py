"""``replay doctor`` and ``replay overfit`` as a user runs them: the console entry point, in
this process where no user code runs (``replay_here``), in a child where the model is rebuilt."""

from __future__ import annotations

import json

import numpy as np

from tests.conftest import RANK_NAN_STEP, ROOT, replay_cli, replay_here


def test_doctor_json_shape(recording):
    r = replay_here("doctor", recording("softmax_before_ce"), "--json")
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert found and set(found[0]) == {"rule", "severity", "title", "evidence", "advice", "steps"}
    assert "softmax_before_cross_entropy" in {f["rule"] for f in found}


def test_doctor_text_healthy(recording):
    r = replay_here("doctor", recording("healthy"))
    assert r.returncode == 0 and "no findings" in r.stdout


def test_doctor_refuses_a_non_recording(tmp_path):
    bad = tmp_path / "x.h5"
    bad.write_text("hello")
    r = replay_here("doctor", str(bad))
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "not an HDF5 file" in r.stderr


def test_overfit_healthy_batch_goes_to_zero(recording):
    # recorded in-process under a synthetic module name: point replay at the script itself
    r = replay_cli(
        "overfit",
        recording("healthy"),
        "--iters",
        "120",
        "--json",
        "--entry",
        f"{ROOT}/examples/healthy.py:build,train_step",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["overfits"] and d["step"] == 0 and d["final_loss"] < 0.01 * d["first_loss"]
    assert len(d["curve"]) == 120


def test_overfit_softmax_before_ce_stalls_at_its_floor(recording):
    r = replay_cli(
        "overfit",
        recording("softmax_before_ce"),
        "--iters",
        "120",
        "--entry",
        f"{ROOT}/examples/softmax_before_ce.py:build,train_step",
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert "does not overfit" in r.stdout and "▁" in r.stdout


def test_overfit_refuses_without_replayable_state(tmp_path):
    import h5py

    from replay.store import open_recording  # noqa: F401 (the file below is a real recording)

    src = tmp_path / "r.h5"
    import doctor_loops

    doctor_loops.record(str(src), "plain", steps=20)
    with h5py.File(src, "r+") as f:  # drop every snapshot: nothing to rebuild from
        f["snapshots/step"][...] = -1
    r = replay_here("overfit", str(src))
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "no replayable state" in r.stderr


def test_overfit_judges_close_still_falling_and_plateau_apart():
    """Regression: a healthy model that came within 15% of the goal was told it "has a bug"."""
    from replay.workflows.overfit import judge

    goal = 0.02
    close = [2.0 * 0.97**i for i in range(150)] + [0.022] * 50  # stalls at 1.1x the goal
    assert judge(close, goal, None, None)[0] == "close"
    falling = [2.0 * 0.985**i for i in range(200)]  # 0.099 and still going down
    verdict, progress, drop = judge(falling, goal, None, None)
    assert verdict == "still_falling" and drop > 0.05 and 0.5 < progress < 1
    plateau = [2.0 * 0.9**i + 1.46 for i in range(200)]  # softmax-before-CE floor
    verdict, progress, drop = judge(plateau, goal, None, None)
    assert verdict == "plateau" and drop < 0.05 and progress < 0.2
    assert judge([2.0, 0.01], goal, 2, None)[0] == "overfits"
    assert judge([2.0], goal, None, "the loss became nan")[0] == "error"


def _doctor(path):
    r = replay_here("doctor", path, "--json")
    assert r.returncode == 0, r.stderr
    return {f["rule"]: f for f in json.loads(r.stdout)}


def test_lr_rule_cites_a_learning_rate_that_was_used(recording):
    """Regression: with the lr set by the loop, the rule cited the median of the recorded
    values, a learning rate never used at the steps that went wrong."""
    from replay.store import open_recording

    path = recording("loop:decaying_lr")
    f = _doctor(path)["learning_rate"]
    with open_recording(path) as rec:
        h = rec.health()
    at = dict(zip(h["step"].tolist(), h["lr"].tolist()))
    assert f["evidence"]["lr"] == at[f["steps"][0]]
    assert f["evidence"]["lr"] != float(np.median(h["lr"]))


def test_lr_rule_names_every_param_groups_learning_rate(recording):
    """The rule cited group 0's learning rate alone: with the first layer's group far too high
    and the rest at 1e-3, it now gives each group's, as recorded at the step it cites."""
    from replay.store import open_recording
    from replay.store.hparams import step_hparams

    path = recording("loop:grouped_lr")
    f = _doctor(path)["learning_rate"]
    with open_recording(path) as rec:
        groups = step_hparams(rec, f["steps"][0])["optimizer"]
    assert f["evidence"]["lrs"] == {"optimizer": [g["lr"] for g in groups]}
    assert f["evidence"]["lrs"]["optimizer"][1] == 1e-3
    assert f["evidence"]["lr"] == groups[0]["lr"] > 1.0
    assert "optimizer group 1 0.001" in f["title"]


def test_doctor_flags_a_run_trained_in_eval_mode(recording):
    f = _doctor(recording("loop:eval_mode"))["model_in_eval_mode"]
    assert f["evidence"]["layers"] == ["2"] and f["severity"] == "warning"
    assert "model_in_eval_mode" not in _doctor(recording("loop:plain"))


def test_a_carried_rnn_state_is_not_judged_as_an_input(recording):
    found = _doctor(recording("loop:rnn_state"))
    assert "inputs_not_normalised" not in found


def test_doctor_on_a_rank_set_name_reports_every_rank_and_who_went_bad_first(rank_set):
    """`replay doctor run.h5` on a rank set exited 3 `run.h5: no such file`."""
    p = replay_here("doctor", rank_set)
    assert p.returncode == 0, p.stderr
    assert f"a rank set of 2 ranks; first bad at step {RANK_NAN_STEP} on rank 1" in p.stdout
    assert "== rank 0 ==" in p.stdout and "== rank 1 ==" in p.stdout
    assert "slowest: rank" in p.stdout
    j = replay_here("doctor", rank_set, "--json")
    d = json.loads(j.stdout)
    assert d["first_bad_step"] == RANK_NAN_STEP and d["first_bad_ranks"] == [1]
    assert set(d["ranks"]) == {"0", "1"}
    assert any(f["rule"] == "nonfinite_recorded" for f in d["ranks"]["1"])

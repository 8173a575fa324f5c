"""``replay whatif RUN.h5 CHANGE...``: the failing steps replayed as recorded, then once per
change, on real recordings of the examples (each recorded once, in about 3 s)."""

from __future__ import annotations

import json

import pytest

from replay.reports import WhatIfReport
from tests.conftest import ROOT, SCRIPTS, replay_cli, run_py

# examples/poisoned_sample.py: POISONED_ROW = 37 * BATCH + 5 (step 37, sample 5)
POISONED_STEP, POISONED_SAMPLE = 37, 5


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif")
    out = {}
    for name in ("gpt_diverging_lr", "poisoned_sample", "amp_bf16_scaler"):
        path = d / f"{name}.h5"
        run_py(str(ROOT / "examples" / f"{name}.py"), str(path), check=True, cwd=d)
        out[name] = path
    return out


def whatif(*args, cwd):
    return replay_cli("whatif", *map(str, args), cwd=cwd)


def test_a_lower_lr_removes_the_divergence_and_another_seed_does_not(recordings, tmp_path):
    run = recordings["gpt_diverging_lr"]
    p = whatif(
        run,
        "--scale",
        "lr=0.1",
        "--seed",
        "1",
        "--set",
        "lr=0.1",
        "--clip",
        "1",
        "--json",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert WhatIfReport.from_json(d).to_json() == d  # what the TUI's what-if panel reads back
    # The baseline reproduces the recording, failure included.
    assert d["reproduces"] is True and d["divergence"] is None
    bad = d["recorded_failure"]
    assert bad is not None and d["baseline_failure"] == bad and d["kind"] == "nonfinite"
    assert d["from_step"] <= bad <= d["to_step"]
    recorded = {s["step"]: s["loss"] for s in d["recorded"]}
    assert {s["step"]: s["loss"] for s in d["baseline"]["steps"]} == recorded
    lower, seed, set_lr, clip = d["experiments"]
    assert lower["change"] == "--scale lr=0.1" and lower["removes_failure"] is True
    assert lower["first_failure"] is None and lower["final_step"] == d["to_step"]
    assert isinstance(lower["final_loss"], float)
    lrs = {s["step"]: s["lr"] for s in lower["steps"]}
    assert all(abs(lr - 0.2) < 1e-12 for lr in lrs.values())  # the recorded 2.0, scaled
    assert seed["change"] == "--seed 1" and seed["removes_failure"] is False
    assert seed["first_failure"] == bad
    assert set_lr["removes_failure"] and {s["lr"] for s in set_lr["steps"]} == {0.1}
    # The clip happens after the gradient norm is measured: the first step's norm is the
    # baseline's, and the failure is gone.
    assert clip["removes_failure"] is True
    assert clip["steps"][0]["grad_norm"] == d["baseline"]["steps"][0]["grad_norm"]
    assert d["removed_by"] == ["--scale lr=0.1", "--set lr=0.1", "--clip 1"]

    only_seed = whatif(run, "--seed", "1", cwd=tmp_path)
    assert only_seed.returncode == 1, only_seed.stderr
    assert "reproduces the recording bitwise" in only_seed.stdout
    assert "verdict: no change removes the failure" in only_seed.stdout


def test_dropping_the_poisoned_sample_removes_the_failure_another_does_not(recordings, tmp_path):
    run = recordings["poisoned_sample"]
    poisoned = f"{POISONED_STEP}:{POISONED_SAMPLE}"
    other = f"{POISONED_STEP}:{POISONED_SAMPLE + 1}"
    p = whatif(run, "--drop-samples", poisoned, "--drop-samples", other, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["reproduces"] is True and d["baseline_failure"] == POISONED_STEP
    dropped, kept = d["experiments"]
    assert dropped["removes_failure"] is True and dropped["first_failure"] is None
    step = next(s for s in dropped["steps"] if s["step"] == POISONED_STEP)
    assert step["samples"] == 31 and not step["failed"]  # 32 samples, one dropped
    assert kept["removes_failure"] is False and kept["first_failure"] == POISONED_STEP
    text = whatif(run, "--drop-samples", other, cwd=tmp_path)
    assert text.returncode == 1, text.stderr
    assert "--drop-samples " + other in text.stdout


def one_error_line(p) -> str:
    assert "Traceback" not in p.stderr and p.stdout == ""
    errors = [line for line in p.stderr.splitlines() if line.startswith("replay: error:")]
    assert len(errors) == 1, p.stderr
    return errors[0]


def test_a_change_the_run_cannot_take_is_refused_before_anything_runs(recordings, tmp_path):
    run = recordings["poisoned_sample"]
    p = whatif(run, "--scale", "no_such_key=2", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1  # one line: refused before the entry points are imported
    assert "no hyper-parameter 'no_such_key'" in one_error_line(p)
    p = whatif(run, "--drop-samples", f"{POISONED_STEP}:32", cwd=tmp_path)
    assert p.returncode == 2 and "has 32 samples" in one_error_line(p)
    p = whatif(run, "--skip-step", "999", cwd=tmp_path)
    assert p.returncode == 2 and "outside the replayable window" in one_error_line(p)
    p = whatif(run, "--dtype", "bfloat16", cwd=tmp_path)
    assert p.returncode == 2 and "only float32 is supported" in one_error_line(p)
    for bad in (["--drop-samples", "37"], ["--clip", "0"], ["--set", "lr"], ["--seed", "x"]):
        p = whatif(run, *bad, cwd=tmp_path)
        assert p.returncode == 2 and one_error_line(p).startswith(f"replay: error: {bad[0]} ")


def test_another_seed_changes_the_dropout_masks_not_the_failure(tmp_path):
    """The test MLP has dropout and a NaN injected at step 10: other draws of the random
    numbers change every loss, and the failure stays (it is not the luck)."""
    run = tmp_path / "mlp.h5"
    args = ["--steps", "12", "--snapshot-every", "5", "--nan-at", "10"]
    run_py(str(SCRIPTS / "mlp_train.py"), str(run), *args, cwd=tmp_path)
    p = whatif(run, "--seed", "1", "--skip-step", "10", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["reproduces"] and d["baseline_failure"] == 10
    seed, skip = d["experiments"]  # in the order given on the command line
    assert skip["change"] == "--skip-step 10" and skip["removes_failure"] is True
    assert seed["first_failure"] == 10 and not seed["removes_failure"]
    base = [s["loss"] for s in d["baseline"]["steps"][:-1]]
    assert all(a != b for a, b in zip(base, [s["loss"] for s in seed["steps"]]))


def test_a_range_without_failure_exits_1_and_says_so(recordings, tmp_path):
    run = recordings["gpt_diverging_lr"]
    p = whatif(
        run, "--from-step", "10", "--to-step", "12", "--skip-step", "11", "--json", cwd=tmp_path
    )
    assert p.returncode == 1, p.stderr
    d = json.loads(p.stdout)
    assert d["baseline_failure"] is None and d["snapshot"] == 10
    skipped = [s["step"] for s in d["experiments"][0]["steps"] if s["skipped"]]
    assert skipped == [11]
    assert "the baseline has no failure in steps 10..12" in p.stderr


def test_a_gradscaler_skip_right_after_a_snapshot_is_not_a_failure(recordings, tmp_path):
    """Regression: the engine read a scaler fresh from a snapshot (no scale tensor yet) as
    "scale unknown", so the skip of the first replayed step looked like a non-finite failure."""
    p = whatif(recordings["amp_bf16_scaler"], "--seed", "1", "--json", cwd=tmp_path)
    d = json.loads(p.stdout)
    first = d["recorded"][0]
    assert d["snapshot"] == d["from_step"] == first["step"] and first["grad_norm"] == "inf"
    assert d["recorded_failure"] is None and d["baseline_failure"] is None
    assert d["baseline"]["steps"][0]["failed"] is False
    assert p.returncode == 1 and "the baseline has no failure" in p.stderr


def test_samples_are_dropped_along_the_axis_the_diagnosis_finds(tmp_path):
    """A time-major batch ``tokens[T, B]``: its samples are columns (dim 1), as bisect finds
    with a probe. Regression: the probe loaded a snapshot whose optimizer state then shared
    memory with the engine's cached copy, so the baseline loaded it again already stepped and
    no longer reproduced the recording."""
    run = tmp_path / "tm.h5"
    run_py(str(SCRIPTS / "diag_time_major.py"), str(run), cwd=tmp_path)
    p = whatif(run, "--drop-samples", "7:7", "--drop-samples", "7:3", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["reproduces"] is True, d["divergence"]
    column, row = d["experiments"]
    assert column["removes_failure"] is True and row["first_failure"] == 7
    assert next(s for s in column["steps"] if s["step"] == 7)["samples"] == 9  # of 10 columns
    p = whatif(run, "--drop-samples", "7:10", cwd=tmp_path)
    assert p.returncode == 2 and "10 samples along dim 1" in one_error_line(p)


@pytest.mark.parametrize("kind", ["tuple", "dataclass"])
def test_a_step_that_changes_its_batch_in_place_does_not_change_the_next_experiment(tmp_path, kind):
    """Regression: the engine handed the step a batch sharing memory with the record it
    caches, so ``x.mul_(0.5)`` in the step halved the batch every later replay of that step
    ran on: experiments that change nothing (another seed, no RNG used) differed. The engine's
    copy then skipped the tensors of an object batch (``dataclass``): the same, for it."""
    run = tmp_path / "inplace.h5"
    run_py(str(SCRIPTS / "inplace_batch.py"), str(run), kind, check=True, cwd=tmp_path)
    p = whatif(
        run,
        "--from-step",
        "1",
        "--to-step",
        "3",
        "--seed",
        "1",
        "--seed",
        "2",
        "--json",
        cwd=tmp_path,
    )
    assert p.returncode == 1, p.stderr  # a healthy run: nothing to remove
    d = json.loads(p.stdout)
    assert d["reproduces"] is True
    base = [s["loss"] for s in d["baseline"]["steps"]]
    assert len(base) == 3
    for e in d["experiments"]:
        assert [s["loss"] for s in e["steps"]] == base, e["change"]


def test_the_amp_run_in_float32_changes_nothing_bad(recordings, tmp_path):
    """The AMP example is healthy (its GradScaler skips are normal): without autocast, or in
    float32, it stays healthy, and the change did take effect (the weights end elsewhere)."""
    p = whatif(
        recordings["amp_bf16_scaler"],
        "--dtype",
        "float32",
        "--no-autocast",
        "--json",
        cwd=tmp_path,
    )
    assert p.returncode == 1, p.stderr  # no failure to remove
    d = json.loads(p.stdout)
    assert d["baseline_failure"] is None and d["reproduces"] is True
    wide, off = d["experiments"]
    assert (wide["change"], off["change"]) == ("--dtype float32", "--no-autocast")
    for e in (wide, off):
        assert e["first_failure"] is None and e["stopped"] is None
        assert isinstance(e["param_distance"], float) and e["param_distance"] > 0
    base = [s["loss"] for s in d["baseline"]["steps"]]
    assert [s["loss"] for s in off["steps"]] != base

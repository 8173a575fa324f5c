"""Recorded runs of a real little model that fail in each way, bisected through the CLI.

Each run is recorded in a subprocess from a real script; the script checks every step itself
(without replay's code) and writes down which step went bad: the test compares with that.
"""

from pathlib import Path

import pytest
from recorded_runs import cli, cli_json, record

SGD_HIGH_LR = {"optimizer": "sgd", "lr": 3.0, "clip": 0, "dropout": 0.1, "gamma": 1.0}


def test_nan_from_too_high_learning_rate(tmp_path):
    run, truth = record(tmp_path, "lr", config=SGD_HIGH_LR, steps=60)
    assert truth["first_bad"] is not None
    rc, d, err = cli_json("bisect", str(run), "--no-trace")
    assert rc == 0, err
    assert d["kind"] == "nonfinite"
    assert d["first_bad_step"] == truth["first_bad"]
    assert d["symptom_step"] == truth["first_nan_loss"]
    assert d["reproducible"] is True and d["deterministic"] is True
    assert d["replayed_steps"] <= 10 + 1 and d["device"] == "cpu"


def test_nan_gradient_with_finite_loss_is_found_one_step_before_the_nan_loss(tmp_path):
    run, truth = record(tmp_path, "nan_grad", at=17)
    assert truth["first_bad"] == 17 and truth["first_nan_loss"] == 18
    rc, d, err = cli_json("bisect", str(run))
    assert rc == 0, err
    assert (d["first_bad_step"], d["symptom_step"]) == (17, 18)
    assert d["loss"] != "nan"  # the loss of the culprit step itself is finite
    assert d["grad_norm"] == "nan"
    assert d["replayed_steps"] == 8 and d["rechecked_steps"] == 1
    # traced: the NaN is produced in backward, by the gradient hook's multiply
    assert d["phase"] == "backward" and d["op"] is not None
    assert d["samples"] is None  # every sample's gradient is poisoned: no sample to blame
    assert Path(d["forensics"]).exists()


def test_poisoned_sample(tmp_path):
    run, truth = record(tmp_path, "poison", at=23)
    assert truth["first_bad"] == 23
    p = cli("bisect", str(run))
    assert p.returncode == 0, p.stderr
    assert "first bad step: 23" in p.stdout
    rc, d, _ = cli_json("bisect", str(run))
    assert d["first_bad_step"] == 23 and d["phase"] == "forward" and d["module"] == "fc1"
    assert 3 in d["samples"]  # sample 3 holds the NaN (its pair partner 2 comes with it)
    assert d["source"]["file"].endswith("train.py") and "self.fc1(x)" in d["source"]["code"]
    assert "self.fc1(x)" in p.stdout  # the human report shows the source line itself


def test_exception_on_odd_sized_batch_replays_the_same_exception_type(tmp_path):
    run, truth = record(tmp_path, "odd_batch", at=14)
    assert truth["raised"] == 14
    rc, d, err = cli_json("bisect", str(run), "--no-trace")
    assert rc == 0, err
    assert d["kind"] == "exception" and d["first_bad_step"] == 14 == d["symptom_step"]
    assert d["exception"]["type"] == "RuntimeError" and "invalid" in d["exception"]["message"]
    assert d["reproducible"] is True
    assert d["op"] is None and d["samples"] is None  # --no-trace


def test_loss_spike_predicate(tmp_path):
    run, truth = record(tmp_path, "spike", at=26)
    losses = truth["losses"]
    med = sorted(losses[:26])
    median = (med[12] + med[13]) / 2
    assert losses[26] > 10 * median and all(
        x <= 10 * sorted(losses[:i])[len(losses[:i]) // 2] for i, x in enumerate(losses[1:26], 1)
    )
    rc, d, err = cli_json("bisect", str(run), "--spike", "10", "--no-trace")
    assert rc == 0, err
    assert d["kind"] == "predicate" and d["first_bad_step"] == 26
    rc2, d2, _ = cli_json("bisect", str(run), "--until", "loss > 10 * median_loss", "--no-trace")
    assert d2["first_bad_step"] == 26 and d2["replayed_steps"] == 7


def test_healthy_window_exits_1_and_says_which_window(tmp_path):
    run, _ = record(tmp_path, "healthy", steps=25)
    p = cli("bisect", str(run))
    assert p.returncode == 1, p.stderr
    assert "healthy" in p.stdout and "steps 0..24" in p.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--until", "__import__('os')"], "may be called"),
        (["--until", "loss.real > 1"], "not allowed"),
        (["--until", "loss > 4 * median_bogus"], "unknown name"),
        (["--spike", "3", "--kind", "nonfinite"], "one of"),
        (["--entry", "nonsense"], "MODULE_OR_FILE:build,step"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, args, needle):
    # Checked before the recording is opened or any user code imported.
    p = cli("bisect", str(tmp_path / "never-opened.h5"), *args)
    assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr


def test_unusable_recording_exits_3(tmp_path):
    bad = tmp_path / "x.h5"
    bad.write_bytes(b"not hdf5 at all")
    p = cli("bisect", str(bad))
    assert p.returncode == 3 and "Traceback" not in p.stderr

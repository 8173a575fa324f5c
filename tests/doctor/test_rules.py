"""Every doctor rule on a real recording where it must fire and on one where it must not."""

from __future__ import annotations

import pytest

from replay.doctor import RULES, Rule, rule

# rule -> (recordings where it must fire, recordings where it must stay silent)
CASES = {
    "initial_loss": (["unnormalised_inputs"], ["healthy", "gpt_diverging_lr"]),
    "loss_rising": (["gpt_diverging_lr"], ["healthy", "forgotten_zero_grad"]),
    "loss_flat": (["dead_relu"], ["healthy"]),
    "loss_oscillating": (["gpt_diverging_lr"], ["healthy"]),
    # clipped_explosion: the pre-clip norm explodes while clip_grad_norm_ holds the update at
    # 1.0 (the norm recorded after the clip sat at the clip value and never fired this)
    "grad_norm_exploding": (
        ["gpt_diverging_lr", "loop:clipped_explosion"],
        ["healthy", "forgotten_zero_grad"],
    ),
    "grad_norm_vanishing": (["loop:tiny_grad"], ["healthy", "dead_relu"]),
    "grad_accumulating": (["forgotten_zero_grad"], ["healthy", "gpt_diverging_lr"]),
    "layer_grad_vanishing": (["dead_relu"], ["healthy"]),
    "update_ratio": (["gpt_diverging_lr", "loop:tiny_lr"], ["healthy"]),
    "params_frozen": (["frozen_layer"], ["healthy"]),
    "optimizer_never_stepped": (["loop:no_step"], ["healthy", "amp_bf16_scaler"]),
    "params_never_updated": (["dead_relu", "loop:no_step"], ["healthy", "frozen_layer"]),
    "params_without_grad": (["dead_relu"], ["healthy", "frozen_layer"]),
    # rnn_state: the RNN's carried hidden state, fed back in the batch, grows past mean 5: a
    # model output, not data. ragged_inputs: a float leaf 2, 3 or 4 wide by step (images of
    # their own sizes, padded lengths) was concatenated across steps and crashed the doctor
    "inputs_not_normalised": (
        ["unnormalised_inputs"],
        ["healthy", "gpt_diverging_lr", "loop:rnn_state", "loop:ragged_inputs"],
    ),
    "model_in_eval_mode": (["loop:eval_mode"], ["healthy", "loop:plain", "dead_relu"]),
    "dead_relu": (["dead_relu"], ["healthy", "unnormalised_inputs"]),
    "activations_saturated": (["loop:saturated"], ["healthy", "loop:plain"]),
    "softmax_before_cross_entropy": (["softmax_before_ce"], ["healthy"]),
    "amp_steps_skipped": (["amp_bf16_scaler"], ["healthy", "loop:amp_collapse"]),
    "amp_scale_collapse": (["loop:amp_collapse"], ["amp_bf16_scaler"]),
    "learning_rate": (["gpt_diverging_lr", "loop:tiny_lr"], ["healthy", "dead_relu"]),
    "nonfinite_recorded": (["gpt_diverging_lr", "where_trap"], ["healthy", "amp_bf16_scaler"]),
    "exception_recorded": (["label_out_of_range"], ["healthy"]),
    # was: a run whose loader raised between steps read as one with nothing wrong
    "died_outside_a_step": (["loop:died_in_loader"], ["healthy", "label_out_of_range"]),
}


def test_every_rule_has_cases():
    assert set(CASES) == set(RULES)


@pytest.mark.parametrize("rule_name,name", [(r, n) for r, (fire, _) in CASES.items() for n in fire])
def test_rule_fires(findings, rule_name, name):
    f = findings(name).get(rule_name)
    assert f is not None, f"{rule_name} did not fire on {name}: {sorted(findings(name))}"
    assert f.severity in ("error", "warning", "info")
    assert f.title and f.advice and isinstance(f.evidence, dict) and f.evidence


@pytest.mark.parametrize(
    "rule_name,name", [(r, n) for r, (_, silent) in CASES.items() for n in silent]
)
def test_rule_silent(findings, rule_name, name):
    assert rule_name not in findings(name), findings(name).get(rule_name)


def test_healthy_run_has_no_warning(findings):
    loud = [f.rule for f in findings("healthy").values() if f.severity != "info"]
    assert loud == []


def test_amp_skips_are_information_only(findings):
    f = findings("amp_bf16_scaler")
    assert f["amp_steps_skipped"].severity == "info"
    assert [r.rule for r in f.values() if r.severity != "info"] == []


def test_registry_refuses_duplicates():
    def loss_flat(ctx):
        return None

    with pytest.raises(ValueError, match="registered twice"):
        rule(loss_flat)
    assert isinstance(RULES["loss_flat"], Rule) and RULES["loss_flat"].check is not loss_flat


def test_learning_rate_direction(findings):
    assert "too high" in findings("gpt_diverging_lr")["learning_rate"].title
    assert "too low" in findings("loop:tiny_lr")["learning_rate"].title


def test_first_step_amp_skip_is_not_a_nonfinite_failure(recording):
    """Regression: GradScaler creates its scale lazily, so the recorder saw no scale before step
    0, wrote NaN, could not tell the skip, and first_bad() called step 0 a NaN failure."""
    from replay.store import open_recording

    with open_recording(recording("amp_bf16_scaler")) as rec:
        h = rec.health()
        assert h["scale"][0] == 2.0**127 and h["scaler_skipped"][0] == 1
        assert rec.first_bad()["nonfinite"] is None

"""Regression: the recorder flagged finite gradients/parameters as NaN/Inf when their float32 L2
norm overflowed, so bisect blamed a step five steps before the first real inf element."""

import math

import torch

from replay.capture.fingerprint import absmax, grad_norm, param_fingerprint
from replay.capture.health import health_row
from replay.store.layout import COL


def test_grad_nonfinite_flag_not_set_by_an_overflowing_norm_of_finite_values():
    p = torch.nn.Parameter(torch.full((4,), 3e38))
    p.grad = torch.full((4,), 3e38)
    assert math.isinf(float(grad_norm([p])))  # the norm overflows...
    assert math.isinf(float(param_fingerprint([p])))
    assert math.isfinite(float(absmax([p.grad])))  # ...while every element is finite
    h = {
        "loss": 1.0,
        "grad_norm": grad_norm([p]),
        "grad_absmax": absmax([p.grad]),
        "param_fingerprint": param_fingerprint([p]),
        "param_absmax": absmax([p]),
    }
    row = health_row(h)
    assert row[COL["grad_nonfinite"]] == 0.0 and row[COL["param_nonfinite"]] == 0.0


def test_absmax_sees_nan_and_inf_elements():
    assert math.isnan(float(absmax([torch.tensor([1.0, math.nan]), torch.tensor([2.0])])))
    assert math.isinf(
        float(absmax([torch.tensor([1.0]), torch.tensor([-math.inf], dtype=torch.float64)]))
    )
    row = health_row({"loss": 1.0, "grad_absmax": torch.tensor(math.nan)})
    assert row[COL["grad_nonfinite"]] == 1.0


def test_a_model_that_holds_no_parameters_is_not_flagged_non_finite():
    """Regression: a model whose layers sit in a plain list (pytorch/examples'
    mnist_forward_forward: ``self.layers = [...]``, each layer with its own optimizer) has no
    parameters of its own; its fingerprint is None, and the recorder flagged param_nonfinite at
    every fingerprinted step, so ``replay bisect`` named step 0 of a healthy run."""
    h = {
        "loss": 1.0,
        "grad_norm": None,
        "param_fingerprint": param_fingerprint([]),
        "param_absmax": absmax([]),
    }
    row = health_row(h)
    assert math.isnan(row[COL["param_nonfinite"]])  # not measured, not "non-finite"
    assert math.isnan(row[COL["param_fingerprint"]])

"""``is_nonfinite``: which health flags make a row a failure, the watched objects' own
(``netG__grad_nonfinite``) included, and AMP's skipped steps excepted for gradients only."""

from __future__ import annotations

import math

import pytest

from replay.bisect.criteria import is_nonfinite

HEALTHY = {"step": 3, "loss_nonfinite": 0.0, "grad_nonfinite": 0.0, "param_nonfinite": 0.0}


@pytest.mark.parametrize(
    ("flags", "failed"),
    [
        ({}, False),
        ({"loss_nonfinite": 1.0}, True),
        ({"grad_nonfinite": 1.0}, True),
        ({"grad_nonfinite": 1.0, "scaler_skipped": 1.0}, False),  # the scaler doing its job
        ({"param_nonfinite": 1.0, "scaler_skipped": 1.0}, True),
        ({"netG__grad_nonfinite": 1.0}, True),
        ({"netG__grad_nonfinite": 1.0, "scaler_skipped": 1.0}, False),
        ({"netG__param_nonfinite": 1.0, "scaler_skipped": 1.0}, True),
        ({"netG__grad_nonfinite": math.nan, "netD__param_nonfinite": None}, False),
        ({"netG__grad_norm": 1.0, "grad_nonfinite_count": 1.0}, False),  # not flag columns
    ],
)
def test_a_row_fails_on_its_own_flags_and_its_objects(flags, failed):
    assert is_nonfinite({**HEALTHY, **flags}) is failed

"""absmax decides the NaN/Inf flags: it must see every non-finite element, on every dtype."""

import math

import pytest
import torch

from replay.capture.fingerprint import absmax, exact_if_needed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_absmax_sees_one_bad_element_anywhere(dtype, bad):
    ts = [torch.randn(7, 5).to(dtype), torch.zeros(0, dtype=dtype), torch.randn(300).to(dtype)]
    assert math.isfinite(float(absmax(ts)))
    ts[2][123] = bad
    got = float(absmax(ts))
    assert math.isnan(got) if math.isnan(bad) else got == math.inf


def test_absmax_is_the_largest_magnitude_across_groups_and_complex():
    ts = [torch.tensor([1.0, -9.0]), torch.tensor([3.0], dtype=torch.float64)]
    ts.append(torch.tensor([3 + 4j]))
    assert float(absmax(ts)) == 9.0
    assert float(absmax([torch.tensor([-2.5])])) == 2.5
    assert absmax([]) is None


def test_exact_pass_runs_only_after_a_nonfinite_norm_on_the_cpu():
    calls = []
    assert exact_if_needed(torch.tensor(3.0), lambda: calls.append(1)) is None and not calls
    exact_if_needed(torch.tensor(math.inf), lambda: calls.append(1))
    assert calls == [1]
    assert exact_if_needed(None, lambda: calls.append(1)) is None

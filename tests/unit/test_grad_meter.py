"""GradMeter (the recorder's per-step gradient measurement) gives the generic grad_norm's values
bit for bit.

Recordings made before it existed replay with it: bisect compares grad_norm bitwise.
"""

from __future__ import annotations

import math

import pytest
import torch

from replay.capture.fingerprint import GradMeter, grad_absmax, grad_norm


def _params(*dtypes: torch.dtype) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    ps = []
    for i, dt in enumerate(dtypes):
        p = torch.nn.Parameter(torch.randn(64 + i, generator=g).to(dt))
        p.grad = torch.randn(64 + i, generator=g).to(dt) * (i + 1)
        ps.append(p)
    return ps


def _reference(ps: list[torch.nn.Parameter]) -> tuple:
    """What the recorder took before GradMeter: the generic grouping over the gradients."""
    gn = grad_norm(ps)
    if gn is None:
        return None, None
    v = float(gn)
    return v, (None if math.isfinite(v) else float(grad_absmax(ps)))


def _same(a, b) -> bool:  # noqa: ANN001
    if a is None or b is None:
        return a is b
    return float(a).hex() == float(b).hex()


def test_one_dtype_matches_bitwise():
    ps = _params(torch.float32, torch.float32, torch.float32)
    gn, gmax = GradMeter(ps)()
    ref = _reference(ps)
    assert _same(gn, ref[0]) and gmax is None and ref[1] is None


def test_mixed_dtypes_match_bitwise():
    ps = _params(torch.float32, torch.float64, torch.float32, torch.bfloat16)
    assert all(_same(a, b) for a, b in zip(GradMeter(ps)(), _reference(ps), strict=True))


def test_missing_grads_are_skipped_and_none_when_all_missing():
    ps = _params(torch.float32, torch.float32)
    ps[0].grad = None
    assert _same(GradMeter(ps)()[0], _reference(ps)[0])
    ps[1].grad = None
    assert GradMeter(ps)() == (None, None)


def test_non_finite_gradient_reports_the_absmax():
    ps = _params(torch.float32, torch.float32)
    ps[1].grad[3] = math.inf
    gn, gmax = GradMeter(ps)()
    assert math.isinf(gn) and math.isinf(gmax)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_create_graph_gradients_record_no_graph():
    w = torch.nn.Parameter(torch.ones(4))
    (w**3).sum().backward(create_graph=True)
    assert w.grad.requires_grad
    gn, _ = GradMeter([w])()
    assert _same(gn, _reference([w])[0])


def test_parameters_that_change_dtype_after_construction_still_measure():
    model = torch.nn.Linear(8, 2)
    meter = GradMeter(list(model.parameters()))
    model.double()  # the meter's groups now say float32 for float64 gradients
    model(torch.randn(3, 8, dtype=torch.float64)).sum().backward()
    assert _same(meter()[0], _reference(list(model.parameters()))[0])

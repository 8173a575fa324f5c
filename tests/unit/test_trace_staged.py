"""Statistics measured in batches (replay/trace/staged.py) and reused for re-viewed values."""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn as nn

from replay.trace import trace_step
from replay.trace.staged import measure
from replay.trace.stats import copy_small, np_stats, quiet_numpy
from tests.unit.test_trace_verdict import find_ops


def test_batched_statistics_match_those_of_each_tensor_alone():
    rng = np.random.default_rng(3)
    arrays = [
        rng.standard_normal(816).astype(np.float32),
        np.zeros(40, np.float32),  # constant: every value in the first bin
        np.array([2.5], np.float32),  # a single value
        (rng.standard_normal(10404) * 1e3).astype(np.float32),  # histogram over a sample
        rng.standard_normal(300),  # float64
        np.where(rng.random(500) < 0.3, 0.0, rng.random(500)).astype(np.float32),  # zeros
    ]
    stats, hists = measure(arrays)
    with quiet_numpy():
        for a, row, hist in zip(arrays, stats, hists):
            want, want_hist = np_stats(a, True)
            np.testing.assert_allclose(row, np.asarray(want, np.float64), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(hist, want_hist, rtol=1e-5)
            assert hist.sum() == np.float32(a.size) or abs(hist.sum() - a.size) < 1e-3 * a.size


def _t_rows(r) -> list[int]:
    return find_ops(r, "aten::t")


def test_a_transposed_weight_gets_the_statistics_of_its_values_each_time():
    """The second ``t()`` of an unchanged weight reuses the first one's statistics; after the
    weight is changed through ``.data`` (a version counter of its own) it is measured again."""
    torch.manual_seed(0)
    lin = nn.Linear(5, 3)
    w = lin.weight.detach().clone()

    def step(model, opt, batch):
        a = model.weight.t()
        b = model.weight.t()
        model.weight.data.mul_(2.0)
        c = model.weight.t()
        loss = model(batch).sum() + (a.sum() + b.sum() + c.sum()) * 0
        loss.backward()
        return loss

    r = trace_step(lin, None, step, torch.randn(4, 5))
    rows = _t_rows(r)[:3]
    first, second, third = (r.op_row(i)["stats"] for i in rows)
    assert first == second
    assert first["max"] == float(w.max()) and first["min"] == float(w.min())
    assert third["max"] == float(2 * w.max()) and third["mean"] != first["mean"]
    assert third["numel"] == 15.0


def test_a_sparse_tensor_is_measured_by_the_values_it_stores():
    """nn.Embedding(sparse=True)'s gradient. Was: copied to numpy, which a sparse tensor cannot
    be: the traced backward raised. Not staged; measured (and checked) by its stored values,
    an index stored twice as the sum of both."""
    from replay.trace.stats import finite_kind, tensor_stats

    coo = torch.sparse_coo_tensor([[0, 2, 2]], [1.0, -3.0, 1.0], (5,), check_invariants=True)
    assert copy_small(coo) is None
    row, _ = tensor_stats(coo)
    assert (row.min, row.max, row.numel) == (-2.0, 1.0, 2.0)
    assert finite_kind(coo) == "finite"
    bad = torch.sparse_coo_tensor([[1]], [float("-inf")], (5,), check_invariants=True)
    assert finite_kind(bad) == "neginf" and tensor_stats(bad)[0].neginf == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ("Sparse CSR tensor support is in beta state")
        csr = torch.tensor([[0.0, float("nan")], [2.0, 0.0]]).to_sparse_csr()
    assert finite_kind(csr) == "nan" and tensor_stats(csr)[0].nan == 1.0

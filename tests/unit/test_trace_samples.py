"""Culprit samples by delta debugging, with a real replay callback; batch slicing."""

from __future__ import annotations

import copy
from collections import namedtuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from replay.trace import (
    batch_size_of,
    find_culprit_samples,
    has_batch_coupling,
    slice_batch,
    trace_step,
)


def step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def test_poisoned_sample_is_named_by_the_batch_and_found_by_replay():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    x[5, 3] = float("nan")
    state = copy.deepcopy((model.state_dict(), opt.state_dict()))

    r = trace_step(model, opt, step, (x, y))
    v = r.verdict
    assert v["kind"] == "nonfinite"
    assert v["batch_nonfinite"] == {"leaves": {"0": [5]}}
    assert v["op"] == "aten::addmm" and v["module"] == "0"  # first op that consumed it
    assert r.batch["leaves"][0]["per_sample"]["nonfinite"][5] == 1

    calls = []

    def fails(indices):  # the replay engine's job: restore, replay on these samples only
        calls.append(list(indices))
        model.load_state_dict(state[0])
        opt.load_state_dict(state[1])
        loss = step(model, opt, slice_batch((x, y), indices))
        return not torch.isfinite(loss)

    samples, exact = find_culprit_samples(fails, batch_size_of((x, y)),
                                          coupled=has_batch_coupling(model))
    assert (samples, exact) == ([5], True)
    assert len(calls) < 16  # better than one replay per sample
    r.set_samples(samples, exact)
    assert r.verdict["samples"] == [5] and r.batch["culprits"] == [5]


def test_ddmin_finds_a_pair_that_must_appear_together():
    def fails(ix):
        return 3 in ix and 11 in ix

    assert find_culprit_samples(fails, 16, coupled=True) == ([3, 11], False)
    assert find_culprit_samples(lambda ix: False, 4, coupled=False) == ([0, 1, 2, 3], False)


def test_slice_batch_nested_structures():
    Pair = namedtuple("Pair", "a b")
    batch = {"x": torch.arange(8).view(4, 2), "meta": [Pair(torch.arange(4), torch.zeros(3))],
             "scale": torch.ones(1), "name": "b0"}
    assert batch_size_of(batch) == 4
    s = slice_batch(batch, [1, 3])
    assert s["x"].tolist() == [[2, 3], [6, 7]]
    assert isinstance(s["meta"][0], Pair) and s["meta"][0].a.tolist() == [1, 3]
    assert s["meta"][0].b.shape == (3,) and s["scale"].shape == (1,) and s["name"] == "b0"


def test_batch_coupling():
    assert has_batch_coupling(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    assert not has_batch_coupling(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)))
    assert not has_batch_coupling(nn.Sequential(nn.BatchNorm1d(2)).eval())

"""Regression: a step function returning ``10**400`` (OverflowError) or a complex scalar tensor
escaped ``rec.step`` and killed training. Whatever a step returns, the recorder records what it
can and training goes on (``filterwarnings = error`` also fails the test if recording stopped).
"""

from __future__ import annotations

import math

import torch

import replay
from replay.store import open_recording

RETURNS = [
    10**400,
    -(10**400),
    torch.tensor(1 + 2j),
    "a string",
    {"accuracy": 0.5},
    [torch.tensor(0.25), "extra"],
    torch.empty(0),
    (x for x in range(3)),
    None,
]
EXPECTED = [math.inf, -math.inf, None, None, None, 0.25, None, None, None]


def build():
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def odd_step(model, optimizer, batch):
    optimizer.zero_grad()
    model(batch).sum().backward()
    optimizer.step()
    return RETURNS[int(batch[0, 0])]


def _record(path):
    """Record one step per entry of RETURNS, checking each comes back unchanged."""
    model, opt = build()
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=odd_step,
        build_fn=build,
        raise_on_nonfinite=False,
        snapshot_every=4,
    ) as rec:
        for i in range(len(RETURNS)):
            got = rec.step(torch.full((3, 2), float(i)))
            assert got is RETURNS[i]  # handed back unchanged
        assert rec.enabled


def test_training_goes_on_whatever_the_step_returns(tmp_path):
    path = tmp_path / "run.h5"
    _record(path)
    with open_recording(path) as r:
        loss = r.health()["loss"]
    assert len(loss) == len(RETURNS)
    for got, want in zip(loss, EXPECTED):
        assert math.isnan(got) if want is None else got == want, (got, want)


def test_a_step_that_returns_no_loss_is_not_a_non_finite_loss(tmp_path):
    """A step returning None (or a complex or empty tensor) has no loss: its loss_nonfinite flag
    was set to 1 from the NaN that stands for "no loss", and bisect named it the failure."""
    path = tmp_path / "run.h5"
    _record(path)
    with open_recording(path) as r:
        flags = r.health()["loss_nonfinite"]
        first = r.first_bad()["nonfinite"]
    for flag, want in zip(flags, EXPECTED):
        if want is None:
            assert math.isnan(flag)
        else:
            assert flag == float(not math.isfinite(want))
    assert first == 0  # the inf of step 0, the only non-finite loss returned

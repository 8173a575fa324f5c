"""The step's picture: per-parameter gradient statistics."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from replay.trace import trace_step


def _step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def test_all_nan_gradient_norm_is_nan_not_zero():
    """A gradient with no finite value had norm 0 in the table, which the TUI showed as dead."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.full((3, 4), math.nan)
    result = trace_step(model, opt, _step, (x, torch.zeros(3, 2)))
    params = result.to_tables(step=0)["params"]
    norms = list(params["grad_norm"])
    assert all(math.isnan(n) for n in norms), norms
    assert list(params["grad_nan"]) == [8.0, 2.0]

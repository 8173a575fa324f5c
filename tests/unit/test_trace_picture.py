"""The step's picture: per-parameter gradient statistics."""

from __future__ import annotations

import collections
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from replay.trace import trace_step
from replay.trace.picture import batch_leaves


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


Pair = collections.namedtuple("Pair", "ids mask")


def test_store_trace_and_tui_name_a_batch_leaf_the_same_way():
    """The TUI's batch view named a leaf ``x[0]``, the trace's verdict ``x.0``, and a namedtuple's
    field was ``[1]`` in one and ``ids`` in the other: one name now (``leaf_path``)."""
    from replay.capture.tensors import to_leaves
    from replay.store.tree import decode, encode, iter_leaves
    from replay_tui.batchstats import batch_leaves as tui_leaves

    batch = {"x": [torch.ones(2, 3), Pair(torch.ones(2), torch.zeros(2))], 7: (torch.ones(2, 1),)}
    manifest, bufs = encode(to_leaves(batch))
    stored = decode(manifest, b"".join(bytes(b) for b in bufs))
    want = ["x[0]", "x[1].ids", "x[1].mask", "7[0]"]
    assert [p for p, _ in batch_leaves(batch)] == want
    assert [p for p, _ in iter_leaves(stored)] == want
    assert [lf.path for lf in tui_leaves(stored)] == want
    assert [p for p, _ in batch_leaves(torch.ones(2))] == ["batch"]

"""Gradient accumulation across ``rec.step`` calls: each call is one micro-batch, and the
optimizer steps every ``ACCUM`` calls. Snapshots (every 3 calls) land while gradients are
pending, so they must hold them. The iteration number reaches the step as a per-step value.

    python accumulate_across_steps.py run.h5
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

ACCUM = 2
STEPS = 12


def build():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model, optimizer, batch, it):
    x, y = batch
    loss = F.mse_loss(model(x), y) / ACCUM
    loss.backward()
    if (it + 1) % ACCUM == 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss


if __name__ == "__main__":
    model, optimizer = build()
    g = torch.Generator().manual_seed(0)
    with replay.Recorder(
        sys.argv[1],
        model=model,
        optimizer=optimizer,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=3,
        keep_snapshots=5,
    ) as rec:
        for it in range(STEPS):
            x = torch.randn(8, 8, generator=g)
            rec.step((x, x.sum(1, keepdim=True)), it=it)

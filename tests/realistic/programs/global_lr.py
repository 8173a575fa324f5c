"""Deliberately not replayable: a manual SGD step reads a global learning rate that the loop
changes between steps. Replay rebuilds with the import-time value, so the parameters drift;
``replay verify`` and ``replay preflight`` must name state changed outside the step.

    python global_lr.py run.h5
"""

import sys

import torch
import torch.nn.functional as F

import replay

LR = 0.1


def build():
    torch.manual_seed(0)
    return {
        "model": torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1))
    }


def train_step(model, batch):
    x, y = batch
    model.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
    return loss


if __name__ == "__main__":
    objects = build()
    g = torch.Generator().manual_seed(0)
    with replay.Recorder(
        sys.argv[1] if len(sys.argv) > 1 else "run.h5",
        objects=objects,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=4,
    ) as rec:
        for it in range(12):
            LR = 0.1 * 0.9**it  # the loop changes the global the step reads
            x = torch.randn(8, 6, generator=g)
            rec.step((x, x[:, :1] * 2))

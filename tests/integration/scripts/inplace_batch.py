"""A healthy run whose step function scales its batch in place (``x.mul_(0.5)``, as data code
often does); no dropout, so a replay of a step from the same state is bitwise the same.

    python inplace_batch.py OUT.h5 [dataclass]

``dataclass``: each batch is a dataclass (``Pair(x, y)``), an object batch, instead of a tuple.

Replay hands the step a batch read from the recording; if that batch shared memory with what
replay keeps of the record, the step would change the record and a second replay of the same
step would run on a batch already scaled.
"""

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import replay

STEPS, SNAPSHOT_EVERY, LR = 12, 4, 0.01


@dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def train_step(model, optimizer, batch):
    x, y = batch if isinstance(batch, tuple) else (batch.x, batch.y)  # (a Pair, or its stand-in)
    x.mul_(0.5)  # in place: the batch the step was given changes
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def main(path: str, kind: str = "tuple") -> None:
    g = torch.Generator().manual_seed(1)
    model, optimizer = build()
    with replay.Recorder(
        path,
        model=model,
        optimizer=optimizer,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=SNAPSHOT_EVERY,
        keep_snapshots=STEPS // SNAPSHOT_EVERY,
    ) as rec:
        for _ in range(STEPS):
            x = 3.0 + 2.0 * torch.randn(32, 8, generator=g)
            y = x.sum(1, keepdim=True)
            rec.step(Pair(x, y) if kind == "dataclass" else (x, y))


if __name__ == "__main__":
    main(*sys.argv[1:3])

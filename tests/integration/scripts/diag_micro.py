"""Gradient accumulation over micro-batches: each batch is ``x[MICRO, B, F]``, ``y[MICRO, B]``
and the step runs the model once per micro-batch. At step BAD_STEP, row BAD_ROW of micro-batch
BAD_MICRO is all zeros and the model normalises each row by its norm: ``0 / 0 = NaN``. The
culprit is the pair (micro-batch BAD_MICRO, row BAD_ROW).

    python diag_micro.py OUT.h5
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

STEPS, BAD_STEP, BAD_MICRO, BAD_ROW, MICRO, BATCH = 10, 7, 2, 5, 4, 8


def make_batch(t: int):
    g = torch.Generator().manual_seed(500 + t)
    x = torch.randn(MICRO, BATCH, 6, generator=g)
    if t == BAD_STEP:
        x[BAD_MICRO, BAD_ROW] = 0.0
    return x, torch.randint(0, 3, (MICRO, BATCH), generator=g)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x):
        return self.lin(x / x.norm(dim=-1, keepdim=True))  # NORMALISE


def build():
    torch.manual_seed(0)
    model = Net()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for xm, ym in zip(x, y):
        loss = F.cross_entropy(model(xm), ym) / len(x)
        loss.backward()
        total = total + loss.detach()
    optimizer.step()
    return total


def main(path: str) -> None:
    model, optimizer = build()
    with replay.Recorder(
        path,
        model=model,
        optimizer=optimizer,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=5,
        keep_snapshots=3,
    ) as rec:
        try:
            for t in range(STEPS):
                rec.step(make_batch(t))
        except replay.NonFiniteLossError:
            pass


if __name__ == "__main__":
    main(sys.argv[1])

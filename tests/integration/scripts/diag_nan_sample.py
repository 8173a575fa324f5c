"""A corrupt sample: at step BAD_STEP, feature BAD_FEATURE of sample BAD_SAMPLE is NaN. The bug
is in the data: the verdict must say so, with the sample, not blame the first linear layer.

    python diag_nan_sample.py OUT.h5
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

STEPS, BAD_STEP, BAD_SAMPLE, BAD_FEATURE, BATCH = 10, 7, 5, 3, 8


def make_batch(t: int):
    g = torch.Generator().manual_seed(300 + t)
    x = torch.randn(BATCH, 6, generator=g)
    if t == BAD_STEP:
        x[BAD_SAMPLE, BAD_FEATURE] = float("nan")
    return x, torch.randint(0, 3, (BATCH,), generator=g)


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


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

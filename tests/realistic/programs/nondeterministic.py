"""Really non-deterministic: the step adds noise drawn from the operating system's entropy pool,
which no RNG state captures. Two replays of one step from the same state disagree, and verify
must call it non-determinism (not state changed outside the step).

    python nondeterministic.py run.h5
"""

import os
import sys

import torch
import torch.nn.functional as F

import replay


def build():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    noise = int.from_bytes(os.urandom(2), "little") * 1e-6
    loss = F.mse_loss(model(batch) + noise, batch.sum(1, keepdim=True))
    loss.backward()
    optimizer.step()
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
        snapshot_every=4,
    ) as rec:
        for _ in range(6):
            rec.step(torch.randn(8, 4, generator=g))

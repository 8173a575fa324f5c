"""A training step without `optimizer.zero_grad()`: every step's gradient is added to all before it.

The bug: `train_step` calls `loss.backward()` and `optimizer.step()` but never clears `.grad`, so
the "gradient" the optimizer sees at step t is the sum of the gradients of steps 0..t. Its norm
grows step after step while the loss stops improving and swings, as if the momentum were 1.

Run:
    python examples/forgotten_zero_grad.py [runs/forgotten_zero_grad.h5]
    replay doctor runs/forgotten_zero_grad.h5

Verdict: none
Doctor: grad_accumulating
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

# -- config -----------------------------------------------------------------------------------
SEED = 0
STEPS = 80
BATCH = 32
N_FEATURES = 20
N_CLASSES = 10
HIDDEN = 64
LR = 2e-2
SNAPSHOT_EVERY = 10

torch.manual_seed(SEED)


def make_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised features; labels from a fixed random linear teacher, so the task is learnable."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, N_FEATURES, generator=g)
    teacher = torch.randn(N_FEATURES, N_CLASSES, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def build():
    model = nn.Sequential(
        nn.Linear(N_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, N_CLASSES),
    )
    return model, torch.optim.SGD(model.parameters(), lr=LR)


def train_step(model, optimizer, batch):
    x, y = batch
    # the bug: no optimizer.zero_grad() here
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def main(path: str) -> None:
    x, y = make_data(STEPS * BATCH)
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
        for step in range(STEPS):
            i = step * BATCH
            loss = rec.step((x[i : i + BATCH], y[i : i + BATCH]))
            if step % 20 == 0 or step == STEPS - 1:
                print(f"step {step:3d}  loss {loss.item():.4f}")
    print(f"recorded {path}; try: replay doctor {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/forgotten_zero_grad.h5")

"""A healthy run: a small MLP learns a synthetic 10-class problem. The control for the others.

Nothing is wrong here. The loss starts near ln(10) = 2.30 (what a fresh classifier over 10
classes should give), falls steadily, and the gradients and updates stay in their usual range.
`replay bisect` finds no failure and `replay doctor` has no warning to give.

Run:
    python examples/healthy.py [runs/healthy.h5]
    replay doctor runs/healthy.h5
    replay bisect runs/healthy.h5        # exit 1: nothing to find

Verdict: none
Doctor: silent
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
LR = 3e-3
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
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
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
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/healthy.h5")

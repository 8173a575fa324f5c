"""Dead ReLUs: a bias initialisation pushes every first-layer unit negative, so nothing flows.

The bug: `build()` initialises the first layer's bias to -4 ("to make activations sparse"). On
standardised inputs the pre-activations are then negative for nearly every sample, the ReLU
outputs zero and passes back zero gradient, and the units never recover. The loss stays at
ln(10). Use the default initialisation (or Kaiming with a zero bias), a smaller learning rate,
or LeakyReLU.

Run:
    python examples/dead_relu.py [runs/dead_relu.h5]
    replay doctor runs/dead_relu.h5

Verdict: none
Doctor: dead_relu
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
    nn.init.constant_(model[0].bias, -4.0)  # the bug: kills every unit of the first layer
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
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/dead_relu.h5")

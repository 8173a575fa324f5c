"""Inputs fed in raw units: features of scale ~1000 (think pixel values 0..255, prices, counts).

The bug: `make_data` returns features with mean ~500 and std ~300 and nothing standardises
them. The first layer's pre-activations are hundreds of times too large, so the loss starts far
above ln(10), jumps around, and learns much more slowly than on standardised inputs. Subtract
the training set's mean and divide by its std (computed on the training set only).

Run:
    python examples/unnormalised_inputs.py [runs/unnormalised_inputs.h5]
    replay doctor runs/unnormalised_inputs.h5

Verdict: none
Doctor: inputs_not_normalised
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
    """Raw-unit features; labels from a fixed random linear teacher, so the task is learnable."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, N_FEATURES, generator=g)
    teacher = torch.randn(N_FEATURES, N_CLASSES, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return 500.0 + 300.0 * x, y  # the bug: raw units, never standardised


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
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/unnormalised_inputs.h5")

"""The `torch.where` trap: masking a NaN in the forward pass does not mask it in the backward.

The bug: a regression predicts a distance as the square root of the model's output and guards
the root with `torch.where(out > 0, out.sqrt(), 0)`. The forward is finite, but autograd
differentiates both branches: where `out` is negative, `sqrt` made a NaN, and its backward
computes 0 / (2 * NaN) = NaN even though `where` sends it a zero gradient. Outputs start
positive; targets of 0 push some below zero, and the gradients of step 6 are NaN. Worse, the
failure is silent: the NaN weights make NaN outputs, `where` maps them to 0, and the loss stays
finite for the rest of the run (only the recorded gradient and weight health shows it). Mask
the input, not the output: `torch.where(out > 0, out, 1).sqrt()` inside the same `where`, or
`out.clamp(min=0).sqrt()` plus an epsilon.

Run:
    python examples/where_trap.py [runs/where_trap.h5]
    replay bisect runs/where_trap.h5

Verdict: kind=nonfinite phase=forward op=aten::sqrt
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
LR = 1e-2
SNAPSHOT_EVERY = 10

torch.manual_seed(SEED)


def make_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised features; labels from a fixed random linear teacher, so the task is learnable."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, N_FEATURES, generator=g)
    teacher = torch.randn(N_FEATURES, N_CLASSES, generator=g)
    return x, torch.relu(x @ teacher[:, 0])  # distances, half of them exactly 0


def build():
    model = nn.Sequential(
        nn.Linear(N_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 1),
    )
    nn.init.constant_(model[4].bias, 2.0)  # outputs start positive
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    out = model(x).squeeze(1)
    distance = torch.where(out > 0, out.sqrt(), torch.zeros_like(out))  # the bug
    loss = F.mse_loss(distance, y)
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
        try:
            for step in range(STEPS):
                i = step * BATCH
                loss = rec.step((x[i : i + BATCH], y[i : i + BATCH]))
                if step % 20 == 0:
                    print(f"step {step:3d}  loss {loss.item():.4f}")
        except replay.NonFiniteLossError as e:
            print(f"training failed at step {rec.next_step - 1}: {type(e).__name__}: {e}")
            print(f"find where it started: replay bisect {path}")
            return
    print(f"no failure in {STEPS} steps; recorded {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/where_trap.h5")

"""A hand-written distance `sqrt(sum((a - b)**2))` hits sqrt at 0: its gradient there is 1/0.

The bug: a siamese-style loss pulls the embeddings of two views of each sample together with a
distance written by hand. Forward is fine at distance 0 (sqrt(0) = 0), but the backward of sqrt
is 1 / (2 sqrt(u)) = inf at u = 0, and inf * 0 (the gradient of (a - b)**2 at a == b) = NaN.
At step 25 the data holds a duplicated pair (sample 7), and the gradients turn NaN.
`torch.linalg.vector_norm(a - b, dim=1)` has a zero gradient at zero, or use
`torch.sqrt(u + 1e-12)`.

Run:
    python examples/sqrt_at_zero.py [runs/sqrt_at_zero.h5]
    replay bisect runs/sqrt_at_zero.h5

Verdict: kind=nonfinite phase=backward op=aten::div samples=7
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
DUPLICATE_ROW = 25 * BATCH + 7  # step 25, sample 7

torch.manual_seed(SEED)


def make_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised features; labels from a fixed random linear teacher, so the task is learnable."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, N_FEATURES, generator=g)
    teacher = torch.randn(N_FEATURES, N_CLASSES, generator=g)
    y = (x @ teacher).argmax(dim=1)
    views = x + 0.1 * torch.randn(x.shape, generator=g)  # a second, noisy view of each sample
    views[DUPLICATE_ROW] = x[DUPLICATE_ROW]  # the trigger: an exact duplicate
    return torch.stack([x, views], dim=1), y


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
    a, b = model(x[:, 0]), model(x[:, 1])
    distance = torch.sqrt(((a - b) ** 2).sum(dim=1))  # the bug: NaN gradient at 0
    loss = F.cross_entropy(a, y) + 0.1 * distance.mean()
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
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/sqrt_at_zero.h5")

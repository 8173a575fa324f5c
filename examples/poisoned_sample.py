"""A poisoned sample: one row of the dataset holds a NaN (a failed parse, a division upstream).

The bug is in the data, not the model: sample 5 of the batch at step 37 has a NaN feature. The
forward pass turns it into a NaN loss, the backward into NaN gradients, and one optimizer step
poisons every weight. `replay bisect` names the step and says the input batch is non-finite (a
data bug, cause=data): which tensor (`batch[0]`), which sample, which position; the first op
that read it (`aten::addmm`) is only context. Check inputs with `torch.isfinite(x).all()` in the
data pipeline, and find where the NaN came from.

Run:
    python examples/poisoned_sample.py [runs/poisoned_sample.h5]
    replay bisect runs/poisoned_sample.h5

Verdict: kind=nonfinite cause=data phase=forward op=aten::addmm module=0 samples=5
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
POISONED_ROW = 37 * BATCH + 5  # step 37, sample 5

torch.manual_seed(SEED)


def make_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised features; labels from a fixed random linear teacher, so the task is learnable."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, N_FEATURES, generator=g)
    teacher = torch.randn(N_FEATURES, N_CLASSES, generator=g)
    y = (x @ teacher).argmax(dim=1)
    x[POISONED_ROW, 3] = float("nan")  # the bug: one corrupt value in the dataset
    return x, y


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
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/poisoned_sample.h5")

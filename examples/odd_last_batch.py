"""An odd last batch against a hard-coded `view`: the dataset size is not a multiple of the batch.

The bug: the model flattens its 5x5 inputs with `x.view(BATCH, -1)`. Every batch has 32 samples
except the last: 1000 samples make 31 full batches and one of 8, and `view(32, -1)` cannot
reshape 8 * 25 = 200 values, so the last step raises. Use `x.flatten(1)` (or
`x.view(x.shape[0], -1)`), or `drop_last=True` in the DataLoader.

Run:
    python examples/odd_last_batch.py [runs/odd_last_batch.h5]
    replay bisect runs/odd_last_batch.h5

Verdict: kind=exception phase=forward op=aten::view
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

# -- config -----------------------------------------------------------------------------------
SEED = 0
STEPS = 32  # one epoch: 31 full batches and one of 8
BATCH = 32
N_FEATURES = 25  # 5x5 single-channel images
N_SAMPLES = 1000  # not a multiple of BATCH
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
    return x.view(n, 1, 5, 5), (x @ teacher).argmax(dim=1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(N_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, N_CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x.view(BATCH, -1))  # the bug: the last batch is smaller


def build():
    model = Net()
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def main(path: str) -> None:
    x, y = make_data(N_SAMPLES)
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
        except RuntimeError as e:
            print(f"training failed at step {rec.next_step - 1}: {type(e).__name__}: {e}")
            print(f"find where it started: replay bisect {path}")
            return
    print(f"no failure in {STEPS} steps; recorded {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/odd_last_batch.h5")

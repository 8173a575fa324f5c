"""A custom `torch.autograd.Function` whose hand-written backward overflows: exp(x) / (1 + exp(x))**2.

The bug: `Sigmoid.backward` writes the sigmoid's derivative from the textbook formula. It is
exact on paper, but in float32 `exp(x)` overflows to inf for x > 88.7 (the first non-finite
value, made in the backward pass), and inf / inf = NaN. The
forward (`torch.sigmoid`) is stable, so nothing looks wrong until a logit grows past 88: with a
learning rate this high on separable data, that happens at step 25. Write the backward from the
saved output instead: `grad * s * (1 - s)`, and check custom Functions with
`torch.autograd.gradcheck` on float64 inputs, including large ones.

Run:
    python examples/custom_function_nan.py [runs/custom_function_nan.h5]
    replay bisect runs/custom_function_nan.h5

Verdict: kind=nonfinite phase=backward op=aten::exp
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
LR = 0.2
SNAPSHOT_EVERY = 10

torch.manual_seed(SEED)


def make_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised features; labels from a fixed random linear teacher, so the task is learnable."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, N_FEATURES, generator=g)
    teacher = torch.randn(N_FEATURES, N_CLASSES, generator=g)
    return x, (x @ teacher[:, 0] > 0).float()  # separable binary labels


class Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        e = torch.exp(x)
        return grad * e / (1 + e) ** 2  # the bug: inf / inf = NaN once x > 88.7


def build():
    model = nn.Sequential(
        nn.Linear(N_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 1),
    )
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    p = Sigmoid.apply(model(x).squeeze(1))
    loss = F.binary_cross_entropy(p, y)
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
        except (replay.NonFiniteLossError, RuntimeError) as e:
            print(f"training failed at step {rec.next_step - 1}: {type(e).__name__}: {e}")
            print(f"find where it started: replay bisect {path}")
            return
    print(f"no failure in {STEPS} steps; recorded {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/custom_function_nan.h5")

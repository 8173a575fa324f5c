"""`torch.log(torch.softmax(z))` instead of `log_softmax`: softmax underflows to 0, log(0) = -inf.

The bug: the loss is computed by hand as `-torch.log(torch.softmax(logits / T, 1))[y]` with a
sharp temperature T = 0.008. Within three steps some class's logit trails the winner by more than
104 * T = 0.83, so its probability underflows to exactly 0 in float32 and log(0) = -inf (an
infinity replay does not blame by itself: -inf is also how masks are written). The loss stays
finite (only the label's log-probability is gathered), but log's backward computes
grad / p = 0 / 0 = NaN for that entry: the gradients of step 2 are NaN, the update poisons every
weight, and the loss of step 3 is NaN. `F.log_softmax` (or `F.cross_entropy`) computes the same
thing stably, in one op, with no underflow.

Run:
    python examples/log_softmax_underflow.py [runs/log_softmax_underflow.h5]
    replay bisect runs/log_softmax_underflow.h5

Verdict: kind=nonfinite phase=backward op=aten::div
"""

import sys

import torch
import torch.nn as nn

import replay

# -- config -----------------------------------------------------------------------------------
SEED = 0
STEPS = 120
BATCH = 32
N_FEATURES = 20
N_CLASSES = 10
HIDDEN = 64
LR = 1e-2
TEMPERATURE = 0.008
LABEL_NOISE = 0.1
SNAPSHOT_EVERY = 10

torch.manual_seed(SEED)


def make_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised features; labels from a fixed random linear teacher, so the task is learnable."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, N_FEATURES, generator=g)
    teacher = torch.randn(N_FEATURES, N_CLASSES, generator=g)
    y = (x @ teacher).argmax(dim=1)
    noisy = torch.rand(n, generator=g) < LABEL_NOISE  # real labels are never all right
    y[noisy] = torch.randint(0, N_CLASSES, (int(noisy.sum()),), generator=g)
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
    probs = torch.softmax(model(x) / TEMPERATURE, dim=1)
    loss = -torch.log(probs).gather(1, y[:, None]).mean()  # the bug: use F.log_softmax
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
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/log_softmax_underflow.h5")

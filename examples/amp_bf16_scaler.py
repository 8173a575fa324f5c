"""bf16 autocast with a GradScaler that skips a step now and then: normal, not a failure.

Nothing is wrong here, and that is the point: a recorder that cried "NaN!" at every skipped AMP
step would be useless. The loss is summed over the batch and scaled by a GradScaler whose scale
starts near the top of bf16's (fp32's) range, so the scaled gradients overflow to inf at the first
steps; the scaler sees the inf, skips `optimizer.step()`, halves the scale and goes on. With
`growth_interval=10` it tries a larger scale every 10 good steps and skips again when that
overflows. `replay bisect` must find no failure (the infs were skipped, never applied), and
`replay doctor` reports the skipped steps as information only. (bf16 has fp32's exponent range,
so it rarely needs a GradScaler at all; fp16 does.)

Run:
    python examples/amp_bf16_scaler.py [runs/amp_bf16_scaler.h5]
    replay bisect runs/amp_bf16_scaler.h5        # exit 1: nothing to find
    replay verify runs/amp_bf16_scaler.h5        # every step, skipped ones included, bitwise
    replay doctor runs/amp_bf16_scaler.h5

Verdict: none
Doctor: silent, amp_steps_skipped
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
INIT_SCALE = 2.0**127  # near the top of the range: the first steps overflow
GROWTH_INTERVAL = 10
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
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    # Named objects: train_step receives each one by its parameter name, the scaler included,
    # and replay rebuilds them all (a module-level SCALER global would be None on replay).
    return {"model": model, "optimizer": optimizer, "scaler": scaler}


def train_step(model, optimizer, scaler, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y, reduction="sum")
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # skipped when the scaled gradients hold inf
    scaler.update()
    return loss.detach() / len(y)


def main(path: str) -> None:
    x, y = make_data(STEPS * BATCH)
    objects = build()
    with replay.Recorder(
        path,
        objects=objects,
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
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/amp_bf16_scaler.h5")

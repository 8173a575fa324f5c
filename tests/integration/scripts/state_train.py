"""A run whose state goes bad where no health column looks: a loss scale kept in a buffer of a
named module (``stats``), multiplied by the batch's gain after each update. At step ``--bad-at``
the gain overflows the scale to inf (float32); the loss, gradients and parameters of that step
are finite. The next step's loss, scaled by it, is inf.

    python state_train.py OUT.h5 [--steps N] [--bad-at K]   # recorded
    python state_train.py --plain [--steps N] [--bad-at K]  # no replay: per step, JSON

``--plain`` says, per step, whether the loss and the scale buffer are finite after the step.
"""

import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

ARGS = None


class Stats(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor(1e10))


def make_batch(t: int):
    g = torch.Generator().manual_seed(700 + t)
    x = torch.randn(8, 6, generator=g)
    y = torch.randint(0, 3, (8,), generator=g)
    bad = ARGS.bad_at if ARGS is not None else 5
    gain = torch.tensor(1e30 if t == bad else 1.0)
    return x, y, gain


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=1e-12)
    return {"model": model, "optimizer": opt, "stats": Stats()}


def train_step(model, optimizer, stats, batch):
    x, y, gain = batch
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y) * stats.scale
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        stats.scale.mul_(gain)  # the next step's scale
    return loss


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--plain", action="store_true")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--bad-at", type=int, default=5)
    ARGS = p.parse_args()
    objs = build()
    if ARGS.plain:
        out = []
        for t in range(ARGS.steps):
            loss = train_step(**objs, batch=make_batch(t))
            out.append(
                {
                    "step": t,
                    "loss_finite": math.isfinite(float(loss.detach())),
                    "scale_finite": bool(torch.isfinite(objs["stats"].scale)),
                }
            )
        print(json.dumps(out))
        return
    with replay.Recorder(
        ARGS.out, objects=objs, step_fn=train_step, build_fn=build, snapshot_every=10
    ) as rec:
        for t in range(ARGS.steps):
            rec.step(make_batch(t))


if __name__ == "__main__":
    main()

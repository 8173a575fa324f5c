"""A tiny MLP trained under replay.Recorder, configurable from the command line for the tests.

    python mlp_train.py OUT.h5 [--steps N] [--lr LR] [--snapshot-every E] [--keep K] [--reach R]
        [--nan-at STEP] [--raise-at STEP] [--vary] [--no-raise] [--sleep S] [--hold FILE]

The batch of step t is a pure function of t (``make_batch``), so a test can check what was
recorded without trusting the recorder.
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

ARGS = None


def make_batch(t: int, vary: bool = False):
    g = torch.Generator().manual_seed(1000 + t)
    n = 8 + (t % 5 if vary else 0)
    x = torch.randn(n, 16, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    return x, y


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))
    lr = ARGS.lr if ARGS is not None else 1e-2
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def train_step(model, optimizer, batch):
    x, y = batch
    if ARGS is not None and ARGS.raise_at is not None and x.shape[0] == 3:
        x = x.view(-1, 32)  # the odd batch meets a hard-coded view
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def recorder(path, **kw):
    """A Recorder over a fresh ``build()``, as the in-process tests use it."""
    model, opt = build()
    return replay.Recorder(
        path, model=model, optimizer=opt, step_fn=train_step, build_fn=build, **kw
    )


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--snapshot-every", type=int, default=10)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--nan-at", type=int, default=None)
    p.add_argument("--raise-at", type=int, default=None)
    p.add_argument("--vary", action="store_true")
    p.add_argument("--no-raise", action="store_true")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--hold", default=None, help="after each step, wait while this file exists")
    p.add_argument("--keep-health", type=int, default=100_000)
    p.add_argument("--reach", type=int, default=None, help="Recorder(reach=...); 0: dense only")
    ARGS = p.parse_args()
    model, opt = build()
    with replay.Recorder(
        ARGS.out,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=ARGS.snapshot_every,
        keep_snapshots=ARGS.keep,
        raise_on_nonfinite=not ARGS.no_raise,
        keep_health=ARGS.keep_health,
        **({} if ARGS.reach is None else {"reach": ARGS.reach}),
    ) as rec:
        for t in range(ARGS.steps):
            x, y = make_batch(t, ARGS.vary)
            if t == ARGS.nan_at:
                x[2, 3] = math.nan
            if t == ARGS.raise_at:
                x, y = x[:3], y[:3]
            rec.step((x, y))
            print(f"step {t}", flush=True)
            if ARGS.sleep:
                time.sleep(ARGS.sleep)
            while ARGS.hold and os.path.exists(ARGS.hold):
                time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A loop that hands the recorder hostile per-step values (issue 31, item 5).

    python hostile_values.py OUT.h5 {deep,big,both} [--steps N] [--taken]

``deep``: ``t=`` a tuple nested 2000 levels deep (killed training with a RecursionError);
``big``: ``xs=list(range(2_000_000))`` (made every step take seconds). The step function does
not take them (they are only recorded), unless ``--taken``. Prints the final loss.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

ARGS = None


def build():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return m, torch.optim.SGD(m.parameters(), lr=0.01)


def train_step(model, optimizer, batch, lr=0.01):
    x, y = batch
    for g in optimizer.param_groups:
        g["lr"] = lr
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def taking_step(model, optimizer, batch, t=None, xs=None):
    return train_step(model, optimizer, batch)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("kind", choices=["deep", "big", "both"])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--taken", action="store_true")
    ARGS = p.parse_args()
    deep = ()
    for _ in range(2000):
        deep = (deep,)
    hostile = {}
    if ARGS.kind in ("deep", "both"):
        hostile["t"] = deep
    if ARGS.kind in ("big", "both"):
        hostile["xs"] = list(range(2_000_000))
    model, opt = build()
    g = torch.Generator().manual_seed(0)
    step_fn = taking_step if ARGS.taken else train_step
    with replay.Recorder(
        ARGS.out, model=model, optimizer=opt, step_fn=step_fn, build_fn=build, snapshot_every=5
    ) as rec:
        for i in range(ARGS.steps):
            x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
            loss = rec.step((x, y), lr=0.01, it=i, **hostile)
    print(f"final loss {float(loss.detach()):.6f}")


if __name__ == "__main__":
    main()

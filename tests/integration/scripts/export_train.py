"""A run for ``replay export``: dropout (RNG), AdamW, a StepLR stepped by the loop, gradients
accumulated across two steps (``zero_grad`` every other step: the gradients a step starts with
are state), per-step values, and a NaN planted in the data at step ``--bad``.

``build``/``train_step``/``batch_for`` import nothing but torch, so the resume side of the test
runs them with ``replay`` never imported. Run: python export_train.py OUT.h5 [--bad N] [--no-sched]
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 24
BATCH = 16
# A loop-stepped scheduler makes only the snapshots' states exportable (replay does not run the
# loop); without one every step's state is. Read from argv at import, as replay restores argv.
SCHED = "--no-sched" not in sys.argv


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5) if SCHED else None
    return (model, opt, sched) if SCHED else (model, opt)


def train_step(model, optimizer, batch, *, it):
    x, y = batch
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    if it % 2 == 1:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss


def batch_for(it, bad=-1):
    g = torch.Generator().manual_seed(1000 + it)
    x = torch.randn(BATCH, 8, generator=g)
    y = torch.randint(0, 4, (BATCH,), generator=g)
    if it == bad:
        x[3, 2] = float("nan")
    return x, y


def main() -> None:
    import replay

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bad", type=int, default=-1)
    ap.add_argument("--no-sched", action="store_true")
    args = ap.parse_args()
    model, opt, *rest = build()
    sched = rest[0] if rest else None
    with replay.Recorder(
        args.out,
        model=model,
        optimizer=opt,
        scheduler=sched,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=4,
        keep_snapshots=8,
    ) as rec:
        for it in range(STEPS):
            try:
                rec.step(batch_for(it, args.bad), it=it)
            except replay.NonFiniteLossError:
                break
            if sched is not None:
                sched.step()


if __name__ == "__main__":
    main()

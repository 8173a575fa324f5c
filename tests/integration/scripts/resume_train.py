"""A plain loop that checkpoints and is resumed, recorded to the same path each time.

    python resume_train.py OUT.h5 CKPT first  [--steps N]   # steps 0..N-1, then CKPT saved
    python resume_train.py OUT.h5 CKPT resume [--steps N]   # from CKPT's step, N more steps

``--bad-step T``: step T takes log(logits - 100), NaN (the batch carries the flag).

The resumed run passes ``start_step`` (the checkpoint's step) to the Recorder, as a resuming
script would.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay


def make_batch(t: int, bad: int):
    g = torch.Generator().manual_seed(300 + t)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    return x, y, torch.tensor(t == bad)


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model, optimizer, batch):
    x, y, bad = batch
    optimizer.zero_grad()
    logits = model(x)
    if bool(bad):
        logits = torch.log(logits - 100)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    return loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("ckpt")
    p.add_argument("phase", choices=["first", "resume"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--bad-step", type=int, default=-1)
    args = p.parse_args()
    model, opt = build()
    start = 0
    if args.phase == "resume":
        ck = torch.load(args.ckpt)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start = ck["step"]
    with replay.Recorder(
        args.out,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=5,
        start_step=start,
    ) as rec:
        for t in range(start, start + args.steps):
            rec.step(make_batch(t, args.bad_step))
    torch.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": start + args.steps},
        args.ckpt,
    )
    print(f"recorded to {rec.path}")


if __name__ == "__main__":
    main()

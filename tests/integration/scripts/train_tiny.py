"""A tiny recorded training run that fails in a chosen way, for the bisect and replay tests.

    python train_tiny.py RUN.h5 --mode MODE --at STEP --steps N --snapshot-every K --truth T.json

Modes: ``healthy``; ``lr`` (no injection: CONFIG holds a learning rate that diverges);
``nan_grad`` (the gradient at step ``--at`` is multiplied by NaN: the loss stays finite there and
turns NaN one step later); ``poison`` (sample 3 of step ``--at``'s batch holds a NaN);
``odd_batch`` (step ``--at`` gets an odd-sized batch, which the pairwise term cannot view);
``spike`` (step ``--at``'s targets are scaled by 30).

The loop checks every step itself, without replay's code, and writes the truth to ``--truth``:
the first step whose loss, gradients (before the next zero_grad) or parameters are non-finite,
the first step whose loss is non-finite, the first step that raised.

CONFIG is rewritten by the tests (they copy this file) because build() must not depend on argv:
replay imports this file again, with other arguments.
"""

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch import nn

import replay

CONFIG = {"optimizer": "adam", "lr": 0.01, "clip": 1.0, "dropout": 0.1, "gamma": 0.9}
D = 8


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D, 32)
        self.drop = nn.Dropout(CONFIG["dropout"])
        self.fc2 = nn.Linear(32, 1)

    def forward(self, x):
        return self.fc2(self.drop(torch.tanh(self.fc1(x))))


def build():
    torch.manual_seed(0)
    model = Net()
    if CONFIG["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=CONFIG["lr"])
    else:
        opt = torch.optim.Adam(model.parameters(), lr=CONFIG["lr"])
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=CONFIG["gamma"])
    return model, opt, sched


def train_step(model, optimizer, batch):
    x, y, gscale = batch["x"], batch["y"], batch["gscale"]
    optimizer.zero_grad(set_to_none=True)
    out = model(x)
    out.register_hook(lambda g: g * gscale)  # identity unless a test injects NaN
    # A pairwise consistency term: needs an even batch (consecutive samples are pairs).
    pair = out.view(-1, 2).diff(dim=1).pow(2).mean()
    loss = F.mse_loss(out, y) + 0.01 * pair
    loss.backward()
    if CONFIG["clip"]:
        torch.nn.utils.clip_grad_norm_(model.parameters(), CONFIG["clip"])
    optimizer.step()
    return loss


def make_batch(gen, step, args):
    n = 7 if args.mode == "odd_batch" and step == args.at else 16
    x = torch.randn(n, D, generator=gen)
    y = x.sum(1, keepdim=True) * 0.5 + 0.1 * torch.randn(n, 1, generator=gen)
    gscale = torch.tensor(1.0)
    if step == args.at:
        if args.mode == "nan_grad":
            gscale = torch.tensor(math.nan)
        elif args.mode == "poison":
            x[3, 2] = math.nan
        elif args.mode == "spike":
            y = y * 30.0
    return {"x": x, "y": y, "gscale": gscale}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--mode", default="healthy")
    p.add_argument("--at", type=int, default=-1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--snapshot-every", type=int, default=10)
    p.add_argument("--truth", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    model, opt, sched = build()
    gen = torch.Generator().manual_seed(1)
    truth = {"first_bad": None, "first_nan_loss": None, "raised": None, "losses": []}

    def note(key, step):
        if truth[key] is None:
            truth[key] = step

    try:
        with replay.Recorder(
            args.out,
            model=model,
            optimizer=opt,
            step_fn=train_step,
            build_fn=build,
            scheduler=sched,
            snapshot_every=args.snapshot_every,
            keep_snapshots=3,
        ) as rec:
            for step in range(args.steps):
                batch = make_batch(gen, step, args)
                try:
                    loss = rec.step(batch)
                except replay.NonFiniteLossError:
                    note("first_nan_loss", step)
                    note("first_bad", step)
                    raise
                except RuntimeError:
                    note("raised", step)
                    raise
                truth["losses"].append(float(loss.detach()))
                grads_ok = all(bool(torch.isfinite(q.grad).all()) for q in model.parameters())
                params_ok = all(bool(torch.isfinite(q).all()) for q in model.parameters())
                if not (grads_ok and params_ok and math.isfinite(float(loss.detach()))):
                    note("first_bad", step)
                sched.step()  # outside train_step: replay must restore lr from the recording
    finally:
        if args.truth:
            with open(args.truth, "w") as fh:
                json.dump(truth, fh)


if __name__ == "__main__":
    main()

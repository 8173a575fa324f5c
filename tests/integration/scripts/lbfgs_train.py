"""A closure optimizer: a small time-series model (float64, as scientific code often is) trained
with ``torch.optim.LBFGS``, whose ``optimizer.step(closure)`` runs several forward/backward passes
in one step (issue 31, item 2).

    python lbfgs_train.py OUT.h5 [--steps N] [--lr LR]   # recorded
    python lbfgs_train.py --plain [--steps N] [--lr LR]  # no replay: per step, JSON

``--plain`` says, per step, whether the loss, the gradients after the step's first closure call
and the parameters after the step are finite, and how many times the closure ran.
"""

import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

ARGS = None
CALLS: list[int] = []  # --plain: closure calls per step


class Forecaster(nn.Module):
    """Predicts the next value of a series from the last 8."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def make_batch(t: int):
    g = torch.Generator().manual_seed(900 + t)
    start = torch.rand(16, 1, generator=g) * 6.28
    series = torch.sin(start + 0.3 * torch.arange(9.0)) + 0.05 * torch.randn(16, 9, generator=g)
    series = series.double()
    # (contiguous: a strided slice is recorded as a contiguous copy, and float64 matmul on the
    # two layouts can differ in the last bits; this test is about the closure)
    return series[:, :8].contiguous(), series[:, 8].contiguous()


def build():
    torch.manual_seed(0)
    model = Forecaster().double()
    lr = ARGS.lr if ARGS is not None else 0.5
    return model, torch.optim.LBFGS(model.parameters(), lr=lr, max_iter=4, history_size=5)


def train_step(model, optimizer, batch):
    x, y = batch

    def closure():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if CALLS:
            CALLS[-1] += 1
        return loss

    return optimizer.step(closure)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--plain", action="store_true")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.5)
    ARGS = p.parse_args()
    model, opt = build()
    if ARGS.plain:
        out = []
        first = {}

        def pre(optimizer, args, kwargs):  # the gradients of the step's first closure call
            # (args[0] is the optimizer itself: torch hands the hook step's own arguments)
            closure = args[1] if len(args) > 1 else kwargs.pop("closure")

            def once():
                loss = closure()
                if "g" not in first:
                    first["g"] = all(bool(torch.isfinite(q.grad).all()) for q in model.parameters())
                    grads = torch.cat([q.grad.flatten() for q in model.parameters()])
                    first["norm"] = float(torch.linalg.vector_norm(grads))
                return loss

            return (args[0], once), kwargs

        opt.register_step_pre_hook(pre)
        for t in range(ARGS.steps):
            CALLS.append(0)
            first.clear()
            loss = train_step(model, opt, make_batch(t))
            out.append(
                {
                    "step": t,
                    "loss_finite": math.isfinite(float(loss.detach())),
                    "first_grads_finite": first["g"],
                    "first_grad_norm": first["norm"],
                    "params_finite": all(bool(torch.isfinite(q).all()) for q in model.parameters()),
                    "closure_calls": CALLS[-1],
                }
            )
        print(json.dumps(out))
        return
    with replay.Recorder(
        ARGS.out, model=model, optimizer=opt, step_fn=train_step, build_fn=build, snapshot_every=5
    ) as rec:
        for t in range(ARGS.steps):
            rec.step(make_batch(t))


if __name__ == "__main__":
    main()

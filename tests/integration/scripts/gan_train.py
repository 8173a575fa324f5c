"""A DCGAN-shaped run: two models, two optimizers, alternating updates in one step, hand-written
binary cross-entropy with ``log``, and D's learning rate 1000x Adam's default (1e-3).

    python gan_train.py OUT.h5 [--steps N] [--d-lr LR]     # recorded with replay.Recorder
    python gan_train.py --plain [--steps N] [--d-lr LR]    # no replay: the ground truth, JSON

D saturates, sigmoid(D(G(z))) underflows to exactly 0, ``log(0)`` is -inf in G's loss and G's
backward turns it into NaN gradients (inf * 0): G's gradients and then G's parameters go bad one
step before D's loss shows anything. netG and optG are passed as named objects.

``--plain`` runs the same steps without replay and says, per step, whether each model's gradients
(before its optimizer's update) and parameters (after the step) are finite, and which aten op of
the step (forward, backward or update, seen by a bare ``TorchDispatchMode``) first made a
non-finite value from finite inputs.
"""

import argparse
import json
import math

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import replay

ARGS = None


class FirstNonFinite(TorchDispatchMode):
    """The first op whose floating inputs are all finite and whose output is not."""

    def __init__(self):
        super().__init__()
        self.first = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ins = [
            bool(torch.isfinite(t).all())
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        ]
        out = func(*args, **kwargs)
        if self.first is None and all(ins) and not func._schema.name.startswith("aten::empty"):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    if not bool(torch.isfinite(t).all()):
                        self.first = func._schema.name
                        break
        return out


def make_batch(t: int):
    g = torch.Generator().manual_seed(500 + t)
    real = torch.randn(16, 8, generator=g) * 0.5 + 2.0
    z = torch.randn(16, 4, generator=g)
    return real, z


def build():
    torch.manual_seed(0)
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    d_lr = ARGS.d_lr if ARGS is not None else 1.0
    optD = torch.optim.Adam(netD.parameters(), lr=d_lr, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    return {"model": netD, "optimizer": optD, "netG": netG, "optG": optG}


def train_step(model, optimizer, netG, optG, batch):
    netD, optD = model, optimizer
    real, z = batch
    # (1) D: maximise log D(x) + log(1 - D(G(z))), binary cross-entropy written out
    optD.zero_grad()
    p_real = torch.sigmoid(netD(real))
    fake = netG(z)
    p_fake = torch.sigmoid(netD(fake.detach()))
    errD = -(torch.log(p_real).mean() + torch.log(1 - p_fake).mean())
    errD.backward()
    optD.step()
    # (2) G: maximise log D(G(z))
    optG.zero_grad()
    p_gen = torch.sigmoid(netD(fake))
    errG = -torch.log(p_gen).mean()  # G's loss: log(0) once D saturates
    errG.backward()
    optG.step()
    return errD


def _finite(ts):
    return all(bool(torch.isfinite(t).all()) for t in ts if t is not None)


def plain(steps):
    """The ground truth: the same steps, checked by hand."""
    objs = build()
    netD, optD, netG, optG = objs["model"], objs["optimizer"], objs["netG"], objs["optG"]
    grads = {}

    def pre(name, params):
        def hook(opt, args, kwargs):
            grads[name] = _finite([p.grad for p in params])

        return hook

    optD.register_step_pre_hook(pre("netD", list(netD.parameters())))
    optG.register_step_pre_hook(pre("netG", list(netG.parameters())))
    out = []
    for t in range(steps):
        grads.clear()
        with FirstNonFinite() as mode:
            loss = train_step(netD, optD, netG, optG, make_batch(t))
        out.append(
            {
                "step": t,
                "loss_finite": math.isfinite(float(loss.detach())),
                "grads_finite": dict(grads),
                "params_finite": {
                    "netD": _finite(netD.parameters()),
                    "netG": _finite(netG.parameters()),
                },
                "first_nonfinite_op": mode.first,
            }
        )
    print(json.dumps(out))


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--plain", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--d-lr", type=float, default=1.0)
    p.add_argument("--snapshot-every", type=int, default=10)
    ARGS = p.parse_args()
    if ARGS.plain:
        plain(ARGS.steps)
        return
    objs = build()
    with replay.Recorder(
        ARGS.out,
        objects=objs,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=ARGS.snapshot_every,
    ) as rec:
        for t in range(ARGS.steps):
            rec.step(make_batch(t))


if __name__ == "__main__":
    main()

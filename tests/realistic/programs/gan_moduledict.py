"""A small GAN shaped like many hand-rolled ones: generator and discriminator in one
``nn.ModuleDict``, two Adam optimizers, and the BCE written out by hand with ``log``. The
discriminator's learning rate is 1000x the generator's (a typo'd config): D saturates, its
sigmoid rounds to exactly 1.0 for a fake sample, and ``log(1 - D(fake))`` is ``log(0) = -inf``.
The backward of that log divides by zero too; the forward ``log`` came first.

    python gan_moduledict.py run.h5 [--d-lr-scale 1000] [--steps 40]
"""

import argparse
import sys

import torch
import torch.nn as nn

import replay

NOISE, DATA, HIDDEN, BATCH, LR = 4, 6, 32, 16, 2e-4


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--d-lr-scale", type=float, default=1000.0)
    p.add_argument("--steps", type=int, default=40)
    return p.parse_args()


ARGS = parse() if __name__ == "__main__" else None


def build():
    torch.manual_seed(5)
    nets = nn.ModuleDict(
        {
            "G": nn.Sequential(nn.Linear(NOISE, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, DATA)),
            "D": nn.Sequential(
                nn.Linear(DATA, HIDDEN), nn.LeakyReLU(0.2), nn.Linear(HIDDEN, 1), nn.Sigmoid()
            ),
        }
    )
    scale = (ARGS or parse()).d_lr_scale
    opt_d = torch.optim.Adam(nets["D"].parameters(), lr=LR * scale, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(nets["G"].parameters(), lr=LR, betas=(0.5, 0.999))
    return {"model": nets, "optimizer": opt_d, "opt_g": opt_g}


def bce(p, target):
    """Binary cross-entropy by hand, as in many GAN tutorials (no clamping)."""
    return -(target * torch.log(p) + (1 - target) * torch.log(1 - p)).mean()


def train_step(model, optimizer, opt_g, batch):
    real, noise = batch
    G, D = model["G"], model["D"]
    ones = torch.ones(real.size(0), 1)
    zeros = torch.zeros(real.size(0), 1)
    # discriminator
    optimizer.zero_grad()
    fake = G(noise)
    loss_d = bce(D(real), ones) + bce(D(fake.detach()), zeros)
    loss_d.backward()
    optimizer.step()
    # generator
    opt_g.zero_grad()
    loss_g = bce(D(fake), ones)
    loss_g.backward()
    opt_g.step()
    return loss_g  # what the loop prints, as many GAN loops do


if __name__ == "__main__":
    objects = build()
    g = torch.Generator().manual_seed(6)
    with replay.Recorder(sys.argv[1], objects=objects, step_fn=train_step, build_fn=build) as rec:
        for i in range(ARGS.steps):
            real = torch.randn(BATCH, DATA, generator=g) * 0.5 + 2.0
            noise = torch.randn(BATCH, NOISE, generator=g)
            loss = rec.step((real, noise))
            print(f"step {i} loss {loss.item():.3f}")

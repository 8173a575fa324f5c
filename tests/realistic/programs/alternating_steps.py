"""A GAN-shaped loop that alternates two step functions of its own file: ``train_d`` on even
steps, ``train_g`` on odd ones, each with its own optimizer (pytorch/examples' dcgan does both
in one step; programs that split them hand the step another function each time). A replay is
handed the program's first, ``train_d``; the step records keep where the run handed
``train_g`` instead (format.md ``step_fn``), and a replay takes it from this module by name.

    python alternating_steps.py [STEPS]
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

torch.manual_seed(0)
net = nn.ModuleDict({"g": nn.Linear(4, 8), "d": nn.Linear(8, 1)})
opt_d = torch.optim.Adam(net["d"].parameters(), lr=2e-3)
opt_g = torch.optim.Adam(net["g"].parameters(), lr=2e-3)


def train_d(batch):
    real, noise = batch
    opt_d.zero_grad()
    fake = net["g"](noise).detach()
    loss = F.softplus(-net["d"](real)).mean() + F.softplus(net["d"](fake)).mean()
    loss.backward()
    opt_d.step()
    return loss


def train_g(batch):
    _, noise = batch
    opt_g.zero_grad()
    loss = F.softplus(-net["d"](net["g"](noise))).mean()
    loss.backward()
    opt_g.step()
    return loss


def main(steps):
    rec = replay.Recorder(
        "run.h5", objects={"model": net, "optimizer": opt_d, "opt_g": opt_g}, snapshot_every=4
    )
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        batch = torch.randn(16, 8, generator=g) + 2.0, torch.randn(16, 4, generator=g)
        rec.step(batch, train_d if i % 2 == 0 else train_g)
    rec.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)

"""A timm / mean-teacher-shaped loop (re-entry: no build_fn): mixup drawn from numpy's RNG,
label-smoothed soft targets, activation checkpointing, OneCycleLR, ``clip_grad_norm_`` and an
EMA of the weights, updated every step in a helper object, whose outputs the loss reads (a mean
teacher). One image holds +inf at sample 3 of step ``--bad``.

The EMA is state the run carries from step to step. Without ``--give-ema`` the Recorder is not
given it, so no snapshot holds it: the self-check says so while the run trains and names it.

    python mean_teacher.py --steps 20 --bad 12 [--give-ema]
"""

import argparse
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import replay

p = argparse.ArgumentParser()
p.add_argument("--out", default="run.h5")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--bad", type=int, default=12)
p.add_argument("--give-ema", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
np.random.seed(0)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return x + F.gelu(self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList([Block(8) for _ in range(2)])
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return self.head(x.mean((2, 3)))


class ModelEma:
    """timm's ModelEmaV2, in miniature."""

    def __init__(self, model, decay=0.9):
        self.module = copy.deepcopy(model).eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model):
        for e, m in zip(self.module.state_dict().values(), model.state_dict().values()):
            if e.dtype.is_floating_point:
                e.mul_(self.decay).add_(m, alpha=1 - self.decay)


def mixup(x, y, alpha=0.2, smoothing=0.1):
    lam = float(np.random.beta(alpha, alpha))
    perm = torch.randperm(x.shape[0])
    x = lam * x + (1 - lam) * x[perm]
    off = smoothing / 10
    y1 = torch.full((y.shape[0], 10), off).scatter_(1, y[:, None], 1 - smoothing + off)
    return x, lam * y1 + (1 - lam) * y1[perm]


model = Net()
ema = ModelEma(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=args.steps)
data = torch.randn(args.steps * 8, 3, 8, 8)
labels = torch.randint(0, 10, (args.steps * 8,))
data[args.bad * 8 + 3, 1, 2, 2] = float("inf")


def train_step(batch):
    x, y = batch
    x, y = mixup(x, y)
    out = model(x)
    with torch.no_grad():
        teacher = F.softmax(ema.module(x) / 0.5, dim=-1)
    loss = torch.sum(-(0.5 * y + 0.5 * teacher) * F.log_softmax(out, dim=-1), dim=-1).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    ema.update(model)
    return loss


objects = {"model": model, "optimizer": opt, "scheduler": sched}
if args.give_ema:
    objects["ema_module"] = ema.module
with replay.Recorder(args.out, objects=objects, step_fn=train_step) as rec:
    for i in range(args.steps):
        loss = rec.step((data[i * 8 : (i + 1) * 8], labels[i * 8 : (i + 1) * 8]))
        if not torch.isfinite(loss):
            break
print("training ended", flush=True)

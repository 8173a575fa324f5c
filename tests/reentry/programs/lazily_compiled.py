"""A step that compiles its loss on its first call (``torch.compile`` inside the step, a
decorator-free pattern of scripts that compile a function, not the model): in a replay the first
step replayed compiles again. argv[1] = N makes step N take log(out - 10), NaN."""

import sys

import torch
import torch.nn.functional as F

import replay

bad = int(sys.argv[1]) if len(sys.argv) > 1 else -1
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
compiled = {}


def head(out, flag):
    return torch.where(flag, torch.log(out - 10), out)


def step(batch):
    x, y, flag = batch
    if "head" not in compiled:
        compiled["head"] = torch.compile(head)
    opt.zero_grad()
    loss = F.mse_loss(compiled["head"](net(x), flag), y)
    loss.backward()
    opt.step()
    return loss


g = torch.Generator().manual_seed(1)
with replay.Recorder(
    "run.h5", objects={"model": net, "optimizer": opt}, step_fn=step, snapshot_every=4
) as rec:
    for i in range(10):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        rec.step((x, y, torch.tensor(i == bad)))

"""A torch.compile'd model (the Recorder gets the OptimizedModule; snapshots hold the plain
module's state and the step runs compiled); argv[1] = N makes step N take log(out - 10), NaN."""

import sys

import torch
import torch.nn.functional as F

import replay

bad = int(sys.argv[1]) if len(sys.argv) > 1 else -1
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
model = torch.compile(net)
opt = torch.optim.SGD(net.parameters(), lr=0.1)


def step(batch):
    x, y, flag = batch
    opt.zero_grad()
    out = model(x)
    if bool(flag):
        out = torch.log(out - 10)
    loss = F.mse_loss(out, y)
    loss.backward()
    opt.step()
    return loss


g = torch.Generator().manual_seed(1)
with replay.Recorder(
    "run.h5", objects={"model": model, "optimizer": opt}, step_fn=step, snapshot_every=4
) as rec:
    for i in range(10):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        rec.step((x, y, torch.tensor(i == bad)))

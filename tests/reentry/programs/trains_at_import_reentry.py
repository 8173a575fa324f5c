"""A flat script that trains when it runs: no main(), no `if __name__ == "__main__":`, no
build_fn. A plain SGD MLP; `BAD_STEP` (argv[1]) puts a NaN into one batch (`cause: data`)."""

import sys

import torch
import torch.nn.functional as F

import replay

BAD_STEP = int(sys.argv[1]) if len(sys.argv) > 1 else -1
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_step(batch):
    x, y = batch
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


with replay.Recorder(
    "run.h5", model=model, optimizer=opt, step_fn=train_step, snapshot_every=5
) as rec:
    for i in range(10):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        if i == BAD_STEP:
            x[2, 3] = float("nan")
        rec.step((x, y))
print("done")

"""An argparse script, shaped like PyTorch's mnist example: arguments parsed at import time,
the model and optimizer built from them, the loop under ``__main__``, prints every few steps.

    python argparse_train.py --lr 0.05 --steps 12 --out run.h5
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

parser = argparse.ArgumentParser(description="a small MLP on synthetic digits")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--hidden", type=int, default=32)
parser.add_argument("--out", default="run.h5")
args = parser.parse_args()  # at import time, as many scripts do


class Net(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(self.drop(F.relu(self.fc1(x)))), dim=1)


def build():
    torch.manual_seed(1)
    model = Net(args.hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    return model, optimizer, scheduler


def train_step(model, optimizer, batch):
    data, target = batch
    optimizer.zero_grad()
    loss = F.nll_loss(model(data), target)
    loss.backward()
    optimizer.step()
    return loss


if __name__ == "__main__":
    model, optimizer, scheduler = build()
    g = torch.Generator().manual_seed(0)
    with replay.Recorder(
        args.out,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=4,
    ) as rec:
        for step in range(args.steps):
            x = torch.randn(args.batch_size, 64, generator=g)
            y = torch.randint(0, 10, (args.batch_size,), generator=g)
            loss = rec.step((x, y))
            scheduler.step()  # stepped outside train_step, as in the mnist example
            if step % 4 == 0:
                print(f"Train step {step}\tLoss: {loss.item():.6f}")

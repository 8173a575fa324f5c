"""Shaped like pytorch/examples imagenet: argparse in main(), the objects made as locals of
main_worker(gpu, args), the step a function that takes them as arguments and is handed to the
Recorder through functools.partial; a per-step value (the epoch)."""

import argparse
import functools

import torch
import torch.nn as nn

import replay


def train_one(images, target, model, criterion, optimizer, epoch):
    output = model(images)
    loss = criterion(output, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def main_worker(gpu, args):
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    g = torch.Generator().manual_seed(3)
    step = functools.partial(
        lambda batch, epoch: train_one(*batch, model, criterion, optimizer, epoch)
    )
    with replay.Recorder(
        args.out, model=model, optimizer=optimizer, step_fn=step, snapshot_every=4
    ) as rec:
        for epoch in range(args.epochs):
            for _ in range(4):
                images = torch.randn(6, 3, 8, 8, generator=g)
                target = torch.randint(0, 10, (6,), generator=g)
                rec.step((images, target), epoch=epoch)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--epochs", default=3, type=int)
    parser.add_argument("--seed", default=0, type=int)
    parser.add_argument("--out", default="run.h5")
    args = parser.parse_args()
    main_worker(None, args)


if __name__ == "__main__":
    main()

"""Batches laid out otherwise than contiguously, recorded: a channels_last image batch through
a BatchNorm2d, or a transposed batch normalised by its columns' statistics. Over the same
values laid out contiguously, both give other bits on the CPU: a replay must give the step its
batch with the recorded strides. Each step prints the strides its batch came with.

    python strided_batches.py OUT.h5 image|transposed [--steps N]
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

MODE = sys.argv[2] if len(sys.argv) > 2 else "image"


def make_batch(t: int):
    g = torch.Generator().manual_seed(500 + t)
    if MODE == "image":
        x = torch.randn(8, 3, 12, 12, generator=g).contiguous(memory_format=torch.channels_last)
    else:
        x = torch.randn(48, 256, generator=g).t()  # (256, 48), strides (1, 256)
    return x, torch.randint(0, 3, (x.shape[0],), generator=g)


def build():
    torch.manual_seed(0)
    if MODE == "image":
        model = nn.Sequential(
            nn.BatchNorm2d(3), nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(400, 3)
        )
    else:
        model = nn.Sequential(nn.Linear(48, 16), nn.ReLU(), nn.Linear(16, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train_step(model, optimizer, batch):
    x, y = batch
    print(f"step batch strides {tuple(x.stride())}", flush=True)
    if MODE == "transposed":
        x = (x - x.mean(0)) / (x.std(0) + 1e-5)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("mode", choices=["image", "transposed"])
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    model, opt = build()
    with replay.Recorder(
        args.out, model=model, optimizer=opt, step_fn=train_step, build_fn=build, snapshot_every=4
    ) as rec:
        for t in range(args.steps):
            rec.step(make_batch(t))


if __name__ == "__main__":
    main()

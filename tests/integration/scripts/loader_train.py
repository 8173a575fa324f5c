"""A regression fed by a DataLoader over a map-style dataset read from a file, recorded with
its batches by reference (``Recorder(loader=...)``): the sample indices and a digest per step.

    python loader_train.py RUN.h5 DATA.npy [--steps 30] [--by-value] [--workers 0] [--scale S]

DATA.npy holds a float32 array of shape (samples, 9): 8 inputs and a target per row.
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import replay


class Rows(Dataset):
    def __init__(self, path):
        self.rows = np.load(path)
        # the files the samples come from, kept as torchvision's ImageFolder keeps them
        self.samples = [(f"rows/{i:04d}.row", 0) for i in range(len(self.rows))]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = torch.from_numpy(self.rows[i].copy())
        return row[:8], row[8:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--by-value", action="store_true")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--scale", type=float, default=None, help="the loop scales each batch")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = DataLoader(
        Rows(args.data),
        batch_size=8,
        shuffle=True,
        generator=torch.Generator().manual_seed(1),
        num_workers=args.workers,
    )

    def step(batch):
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    with replay.Recorder(
        args.path,
        objects={"model": model, "optimizer": optimizer},
        step_fn=step,
        loader=loader,
        by_reference=not args.by_value,
        snapshot_every=10,
    ) as rec:
        t = 0
        while t < args.steps:
            for batch in loader:
                if t == args.steps:
                    break
                if args.scale is not None:
                    batch = (batch[0] * args.scale, batch[1])
                rec.step(batch)
                t += 1


if __name__ == "__main__":
    main()

"""A training loop fed by a DataLoader with worker processes, shuffling and dropout: the
workers are forked from a process whose Recorder is live. The run must record, replay bitwise,
and survive SIGTERM sent to its whole process group (Ctrl-C style, a job scheduler) with the file
intact and no worker left behind.

    python dataloader_workers.py run.h5 [--steps N] [--sleep S]
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import replay


class Noisy(Dataset):
    """Samples drawn in the worker with torch's RNG: the batches differ run to run."""

    def __len__(self):
        return 128  # 8 batches an epoch: workers are forked again each epoch

    def __getitem__(self, i):
        x = torch.randn(10)
        return x, (x.sum() > 0).long()


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 2)
    )
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3)}


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sleep", type=float, default=0.0)
    args = ap.parse_args()
    objects = build()
    loader = DataLoader(Noisy(), batch_size=16, shuffle=True, num_workers=2)
    with replay.Recorder(
        args.out, objects=objects, step_fn=train_step, build_fn=build, snapshot_every=5
    ) as rec:
        step = 0
        while step < args.steps:
            for batch in loader:
                loss = rec.step(batch)
                print(f"step {step} loss {loss.item():.4f}", flush=True)
                step += 1
                time.sleep(args.sleep)
                if step >= args.steps:
                    break


if __name__ == "__main__":
    main()

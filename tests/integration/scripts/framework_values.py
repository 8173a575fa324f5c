"""A loop that hands the recorder the per-step values frameworks hand it (issue 44, item 3).

    python framework_values.py OUT.h5 [--steps N] [--nan-at T]

Lightning passes a list of RNG-state tensors (``micro_rng``), Hugging Face a 0-dim tensor
(``num_items_in_batch``), loops log numpy scalars and nested dicts of tensors; the step returns
``(loss, metrics)`` with tensors in the metrics. At step ``--nan-at`` one input is NaN, so the
loss is NaN there: every command has a failure to read.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import replay


def build():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    return m, torch.optim.SGD(m.parameters(), lr=0.05)


def train_step(model, optimizer, batch, **values):
    x, y = batch
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss, {"acc": (model(x).argmax(-1) == y).float().mean(), "lr": np.float32(0.05)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--nan-at", type=int, default=8)
    args = p.parse_args()
    model, opt = build()
    g = torch.Generator().manual_seed(0)
    with replay.Recorder(
        args.out, model=model, optimizer=opt, step_fn=train_step, build_fn=build, snapshot_every=4
    ) as rec:
        for i in range(args.steps):
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
            if i == args.nan_at:
                x[3, 2] = float("nan")
            values = {
                "num_items_in_batch": torch.tensor(16),  # Hugging Face: a 0-dim tensor
                "micro_rng": [torch.get_rng_state()],  # Lightning: RNG-state tensors
                "epoch": np.int64(i // 4),  # numpy scalars
                "scale": np.float32(1.0),
                "weights": np.array([0.25, 0.75]),
                "logged": {"ema": torch.tensor([0.5, 1.5]), "inner": {"n": np.int32(i)}},
                "pair": (torch.tensor(1.0), "a"),
            }
            try:
                loss, metrics = rec.step((x, y), **values)
            except replay.NonFiniteLossError as e:
                print(e)
                break
            print(f"step {i} loss {float(loss):.4f} acc {float(metrics['acc']):.3f}")


if __name__ == "__main__":
    main()

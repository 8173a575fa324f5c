"""A tiny regression trained for many steps with default Recorder settings; one batch, at step
``--at``, is scaled by 1e3: a finite gradient-norm spike, clipped, and training goes on.

    python reach_spike.py RUN.h5 --steps 3000 --at 300
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import replay


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--at", type=int, default=300)
    ap.add_argument("--reach", type=int, default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1)

    def step(batch):
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    options = {} if args.reach is None else {"reach": args.reach}
    with replay.Recorder(
        args.path, objects={"model": model, "optimizer": optimizer}, step_fn=step, **options
    ) as rec:
        for t in range(args.steps):
            x = torch.randn(8, 8, generator=data)
            y = x.sum(dim=1, keepdim=True)
            if t == args.at:
                x = x * 1e3
            rec.step((x, y))


if __name__ == "__main__":
    main()

"""A torchrun program (pytorch/examples' DDP tutorial shape): the process group and the DDP
wrapper made in main(), a closure step, no build_fn. `--bad-rank R --bad-step T` puts a NaN into
rank R's batch at step T; `--die-rank R --die-step T` makes rank R's data raise before step T
(a corrupt sample in its loader: outside any step)."""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import replay


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--bad-rank", type=int, default=-1)
    p.add_argument("--bad-step", type=int, default=-1)
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-step", type=int, default=-1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)

    def step(batch):
        x, y = batch
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    try:
        with replay.Recorder(
            "run.h5", model=model, optimizer=optimizer, step_fn=step, snapshot_every=4
        ) as rec:
            for t in range(args.steps):
                x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
                if rank == args.die_rank and t == args.die_step:
                    raise OSError(f"image file is truncated (sample {4 * t + 1})")
                if rank == args.bad_rank and t == args.bad_step:
                    x[1, 2] = float("nan")
                rec.step((x, y))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

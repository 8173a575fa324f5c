"""DDP with ``ZeroRedundancyOptimizer`` (ZeRO-1): each rank keeps only its shard of Adam's
state, and ``optimizer.state_dict()`` raises until every rank has gathered the whole state on
one (``consolidate_state_dict``). Under torchrun:

    torchrun --standalone --nproc_per_node=2 zero_ddp.py run.h5 [--steps 20] [--bad 12]

``--bad N``: rank 1's batch at step N holds an inf.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import replay


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--bad", type=int, default=-1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3
    )

    def train_step(model, optimizer, batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    rec = replay.Recorder(
        args.out,
        objects={"model": model, "optimizer": optimizer},
        step_fn=train_step,
        snapshot_every=5,
    )
    g = torch.Generator().manual_seed(1 + rank)
    for i in range(args.steps):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        if i == args.bad and rank == 1:
            x[3, 5] = float("inf")
        rec.step((x, y))
    rec.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

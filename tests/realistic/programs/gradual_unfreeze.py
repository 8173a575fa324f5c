"""Fine-tuning with gradual unfreezing (ULMFiT, timm and fastai recipes): a pretrained-style
backbone stays frozen while the new head trains; at step ``--at`` the loop unfreezes it, between
two steps, in one of two ways:

- ``--how group`` (the default): ``backbone.requires_grad_(True)`` and
  ``optimizer.add_param_group(...)`` with the backbone's own learning rate;
- ``--how flag``: the optimizer held every parameter from the start; the loop only sets
  ``requires_grad`` and raises the learning rate.

The planted bug: the backbone's learning rate is 10,000x too high, so a few steps after the
unfreeze the loss explodes to NaN. ``--at`` is off the snapshot grid (every 10 steps) by default:
a replay from the snapshot before it must unfreeze as the loop did.

    python gradual_unfreeze.py run.h5 [--at 21] [--how group|flag] [--steps 60]
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--at", type=int, default=21)
    p.add_argument("--how", choices=["group", "flag"], default="group")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--backbone-lr", type=float, default=500.0)
    args = p.parse_args()
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    head = nn.Linear(64, 3)
    model = nn.Sequential(backbone, head)
    backbone.requires_grad_(False)
    trained = head.parameters() if args.how == "group" else model.parameters()
    optimizer = torch.optim.SGD(trained, lr=0.05, momentum=0.9)
    features = torch.randn(512, 8)
    labels = (features[:, 0] > 0).long() + (features[:, 1] > 1).long()

    def train_step(batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    with replay.Recorder(
        args.out, model=model, optimizer=optimizer, step_fn=train_step, snapshot_every=10
    ) as rec:
        for step in range(args.steps):
            if step == args.at:
                backbone.requires_grad_(True)
                if args.how == "group":
                    optimizer.add_param_group(
                        {"params": backbone.parameters(), "lr": args.backbone_lr}
                    )
                else:
                    for group in optimizer.param_groups:
                        group["lr"] = args.backbone_lr
            rows = torch.randint(0, len(features), (32,))
            loss = rec.step((features[rows], labels[rows]))
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)

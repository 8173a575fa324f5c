"""A recommendation model (DLRM-shaped): ids pooled by an ``nn.EmbeddingBag(sparse=True)``,
whose gradient is a sparse tensor, updated by ``SparseAdam``; the dense MLP on top by Adam. Two
optimizers, both stepped in the step.

The planted bug: the label of sample 5 at step ``--bad`` is NaN (a broken join in the data
pipeline); the loss is NaN.

    python sparse_embeddings.py run.h5 [--bad 12] [--steps 30]
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

IDS, DIM, BAG, BATCH = 1000, 16, 4, 16


class Recommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(IDS, DIM, mode="sum", sparse=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, ids, offsets):
        return self.mlp(self.embed(ids, offsets)).squeeze(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--bad", type=int, default=12)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.manual_seed(0)
    model = Recommender()
    sparse_opt = torch.optim.SparseAdam(list(model.embed.parameters()), lr=1e-2)
    dense_opt = torch.optim.Adam(model.mlp.parameters(), lr=1e-3)

    def train_step(batch):
        ids, offsets, clicked = batch
        loss = F.binary_cross_entropy_with_logits(model(ids, offsets), clicked)
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        return loss

    objects = {"model": model, "optimizer": dense_opt, "sparse_opt": sparse_opt}
    with replay.Recorder(args.out, objects=objects, step_fn=train_step) as rec:
        for step in range(args.steps):
            ids = torch.randint(0, IDS, (BATCH * BAG,))
            offsets = torch.arange(0, BATCH * BAG, BAG)
            clicked = torch.rand(BATCH).round()
            if step == args.bad:
                clicked[5] = float("nan")
            print(f"step {step} loss {rec.step((ids, offsets, clicked)).item():.4f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)

"""A loop whose batches are objects, as much modern training code writes them:

- ``--kind dataclass``: a ``@dataclass`` batch with a ``to(device)`` method (the step calls it);
- ``--kind encoding``: a ``collections.UserDict`` whose keys also read as attributes, the shape
  of Hugging Face's ``BatchEncoding`` (``model(**batch)`` in a custom loop);
- ``--kind graph``: a plain object holding node features, edges and labels, the shape of
  torch_geometric's ``Data``.

The planted bug: feature 0 of sample 4 at step ``--bad`` is NaN (a corrupted record).

    python object_batches.py run.h5 [--kind dataclass|encoding|graph] [--bad 9] [--steps 20]
"""

import argparse
import collections
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

FEATURES, CLASSES, BATCH = 8, 3, 16


@dataclass
class Batch:
    features: torch.Tensor
    labels: torch.Tensor

    def to(self, device):
        return Batch(self.features.to(device), self.labels.to(device))


class Encoding(collections.UserDict):
    def __getattr__(self, name):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


class Graph:
    def __init__(self, x, edge_index, y):
        self.x, self.edge_index, self.y = x, edge_index, y


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, features=None, edge_index=None):
        if edge_index is not None:  # one step of mean message passing along the edges
            features = features.index_add(0, edge_index[1], features[edge_index[0]]) / 2
        return self.body(features)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--kind", choices=["dataclass", "encoding", "graph"], default="dataclass")
    p.add_argument("--bad", type=int, default=9)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(batch):
        if isinstance(batch, Batch):
            batch = batch.to("cpu")
            logits, labels = model(batch.features), batch.labels
        elif isinstance(batch, Encoding):
            labels = batch.labels
            logits = model(**{k: v for k, v in batch.items() if k != "labels"})
        else:
            logits, labels = model(batch.x, batch.edge_index), batch.y
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    with replay.Recorder(args.out, model=model, optimizer=optimizer, step_fn=train_step) as rec:
        for step in range(args.steps):
            x, y = torch.randn(BATCH, FEATURES), torch.randint(0, CLASSES, (BATCH,))
            if step == args.bad:
                x[4, 0] = float("nan")
            if args.kind == "dataclass":
                batch = Batch(x, y)
            elif args.kind == "encoding":
                batch = Encoding(features=x, labels=y)
            else:
                batch = Graph(x, torch.randint(0, BATCH, (2, 24)), y)
            print(f"step {step} loss {rec.step(batch).item():.4f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)

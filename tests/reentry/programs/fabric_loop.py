"""A Lightning Fabric loop (Fabric's examples' shape): fabric.setup, fabric.backward,
fabric.clip_gradients; the objects handed to the Recorder are Fabric's wrapped ones."""

import sys

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric

import replay


def main():
    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    fabric.seed_everything(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 3)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(2)
    bad = int(sys.argv[1]) if len(sys.argv) > 1 else -1

    def step(batch):
        x, y = batch
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        fabric.backward(loss)
        fabric.clip_gradients(model, optimizer, max_norm=1.0)
        optimizer.step()
        return loss

    with replay.Recorder(
        "run.h5",
        objects={"model": model, "optimizer": optimizer, "fabric": fabric},
        step_fn=step,
        snapshot_every=4,
    ) as rec:
        for i in range(12):
            x, y = torch.randn(6, 8, generator=g), torch.randint(0, 3, (6,), generator=g)
            if i == bad:
                x = torch.log(x)  # negative inputs: NaN
            rec.step((x, y))


if __name__ == "__main__":
    main()

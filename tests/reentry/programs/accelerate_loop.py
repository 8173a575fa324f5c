"""An accelerate loop with gradient accumulation (accelerate's examples' shape)."""

import sys

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import replay

RECORD = "--no-replay" not in sys.argv


def main():
    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 3)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 3, 0.5)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    loader = DataLoader(
        data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    def step(batch):
        x, y = batch
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        return loss

    losses = []
    if RECORD:
        with replay.Recorder(
            "run.h5",
            objects={
                "model": model,
                "optimizer": optimizer,
                "scheduler": scheduler,
                "accelerator": accelerator,
            },
            step_fn=step,
            snapshot_every=5,
        ) as rec:
            for batch in loader:
                losses.append(float(rec.step(batch)))
    else:
        for batch in loader:
            losses.append(float(step(batch)))
    print("losses", " ".join(f"{v:.6f}" for v in losses))


if __name__ == "__main__":
    main()

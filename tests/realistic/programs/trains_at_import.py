"""Trains at import time: the loop is not under ``if __name__ == "__main__":``. Replay must
refuse to import it (a second training run), never run it.

    python trains_at_import.py run.h5
"""

import sys

import torch
import torch.nn.functional as F

import replay


def build():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = F.mse_loss(model(batch), batch.sum(1, keepdim=True))
    loss.backward()
    optimizer.step()
    return loss


model, optimizer = build()
out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].endswith(".h5") else "run.h5"
try:
    with replay.Recorder(
        out, model=model, optimizer=optimizer, step_fn=train_step, build_fn=build, snapshot_every=4
    ) as rec:
        for _ in range(8):
            rec.step(torch.randn(4, 4))
except Exception as e:  # noqa: BLE001 - a broad handler, as scripts have: replay's refusal must survive it
    print(f"training stopped: {e}")

"""Not replayable: the step uses an object the ``__main__`` block creates and ``build`` does not
return (the shape the AMP example had with a module-level ``SCALER = None``). The replayed step
raises, and verify must say that the step needs state ``build_fn`` does not create.

    python global_object.py run.h5
"""

import sys

import torch
import torch.nn.functional as F

import replay

SCALER = None  # created under __main__ only


def build():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    SCALER.scale(loss).backward()
    SCALER.step(optimizer)
    SCALER.update()
    return loss


if __name__ == "__main__":
    model, optimizer = build()
    SCALER = torch.amp.GradScaler("cpu")
    with replay.Recorder(
        sys.argv[1],
        model=model,
        optimizer=optimizer,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=4,
    ) as rec:
        for _ in range(6):
            rec.step((torch.randn(8, 4), torch.randint(0, 2, (8,))))

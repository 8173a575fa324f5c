"""A tiny real training run for the TUI tests: ``python train_fixture.py OUT_DIR [--trace]``.

Copied into OUT_DIR and run there, so the recording's paths are relative to its folder (the
screens show ``train_fixture.py:NN``, stable across machines). Step 6's batch has
samples 3 and 5 all zeros: ``Normalize`` divides them by their zero norm (0/0, a NaN
produced inside the model, in ``body.0.norm``), the loss goes NaN and the Recorder stops the run. With ``--trace`` it rebuilds
the model, re-runs steps 0..5 and traces step 6 into ``run.forensics.h5`` (needs replay.trace).
"""

import os
import sys

import torch
from torch import nn

import replay

torch.set_num_threads(1)
BAD_STEP, BAD_SAMPLES = 6, (3, 5)


class Normalize(nn.Module):
    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)


class Block(nn.Module):
    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=bias)
        self.norm = Normalize()

    def forward(self, x):
        return self.norm(self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(Block(bias=False), Block())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.body(x))


def build():
    torch.manual_seed(0)
    model = Net()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, optimizer, batch):
    x, y = batch["x"], batch["y"]
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def batch_of(step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(8, 8, generator=g)
    y = torch.randint(0, 2, (8,), generator=g)
    if step == BAD_STEP:
        x[list(BAD_SAMPLES)] = 0.0
    return {"x": x, "y": y}


def main(out: str, trace: bool) -> None:
    path = os.path.join(out, "run.h5")
    model, opt = build()
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=4,
        keep_snapshots=3,
        handle_signals=False,
    ) as rec:
        for step in range(10):
            try:
                rec.step(batch_of(step))
            except replay.NonFiniteLossError:
                break
    if trace:
        from replay.store import open_recording
        from replay.trace import trace_step

        model, opt = build()
        for step in range(BAD_STEP):
            train_step(model, opt, batch_of(step))
        result = trace_step(model, opt, train_step, batch_of(BAD_STEP))
        with open_recording(path) as r:
            run_id = r.run_id
        result.write(os.path.join(out, "run.forensics.h5"), run_id=run_id, step=BAD_STEP)


if __name__ == "__main__":
    main(sys.argv[1], "--trace" in sys.argv)

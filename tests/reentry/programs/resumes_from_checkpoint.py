"""A program that resumes from its own checkpoint when it starts, shaped like pytorch/examples'
imagenet ``--resume`` and the DDP tutorial's snapshot: ``checkpoint.pt`` is written every few
steps while it trains; at start-up, if it exists, the model, optimizer and step are loaded back.

Its resume code was never run while it recorded (no checkpoint existed yet), and it reads a key
the save does not write (``state_dict`` for ``model``): the bug that waits in every resume path
nobody has exercised. A replay runs the start-up again, against the checkpoint the run wrote
since, and the resume raises ``KeyError`` before the Recorder.

    python resumes_from_checkpoint.py [STEPS]
"""

import os
import sys

import torch

import replay

CKPT = "checkpoint.pt"


def main(steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if os.path.exists(CKPT):  # resume
        ckpt = torch.load(CKPT)
        model.load_state_dict(ckpt["state_dict"])
        opt.load_state_dict(ckpt["optimizer"])
        start = ckpt["step"] + 1

    def step(batch):
        x, y = batch
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    rec = replay.Recorder("run.h5", model=model, optimizer=opt, step_fn=step)
    g = torch.Generator().manual_seed(1)
    for t in range(start, steps):
        batch = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        rec.step(batch)
        if t % 4 == 3:
            torch.save(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": t}, CKPT
            )
    rec.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)

"""A run on the GPU for ``make gpu-check``: a small MLP under fp16 autocast with a GradScaler,
clipping and a learning rate set by the loop; with ``--diverge`` the learning rate is far too
high and the loss turns non-finite. Everything the recorder does on a GPU is exercised: health
flags read a step late, batches copied out asynchronously, CUDA RNG states.

    python tests/gpu/cuda_run.py run.h5 [--diverge]
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--diverge", action="store_true")
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()

LR = 30.0 if args.diverge else 1e-2


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 10))
    model = model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12)
    return {"model": model, "optimizer": optimizer, "scaler": scaler}


def train_step(model, optimizer, scaler, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    scaler.step(optimizer)
    scaler.update()
    return loss


if __name__ == "__main__":
    objects = build()
    g = torch.Generator(device="cuda").manual_seed(1)
    with replay.Recorder(
        args.out,
        objects=objects,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=10,
        raise_on_nonfinite=False,
    ) as rec:
        for it in range(args.steps):
            for group in objects["optimizer"].param_groups:
                group["lr"] = LR * min(1.0, (it + 1) / 5)
            x = torch.randn(64, 32, device="cuda", generator=g) * (1 + it)
            y = torch.randint(0, 10, (64,), device="cuda", generator=g)
            rec.step((x, y))

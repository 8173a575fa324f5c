"""Tiny real training loops for the doctor rules no example covers (module-level entry points,
as the Recorder requires). ``VARIANT`` picks the bug; ``record(path, variant)`` runs it."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

VARIANT = "plain"
LR = {
    "plain": 3e-3,
    "tiny_lr": 1e-9,
    "tiny_grad": 3e-3,
    "no_step": 3e-3,
    "saturated": 3e-3,
    "amp_collapse": 3e-3,
}


def build():
    torch.manual_seed(0)
    act = nn.Tanh() if VARIANT == "saturated" else nn.ReLU()
    model = nn.Sequential(nn.Linear(8, 32), act, nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=LR[VARIANT])
    if VARIANT == "amp_collapse":
        return model, opt, None, torch.amp.GradScaler("cpu", init_scale=2.0**16)
    return model, opt


SCALER = None


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    if VARIANT == "amp_collapse":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        # a loss path that is inf in any precision: the scaler can never find a good scale
        SCALER.scale(loss * torch.tensor(float("inf"))).backward()
        SCALER.step(optimizer)
        SCALER.update()
        return loss.detach()
    loss = F.cross_entropy(model(x), y)
    (loss * 1e-12 if VARIANT == "tiny_grad" else loss).backward()
    if VARIANT != "no_step":
        optimizer.step()
    return loss


def record(path: str, variant: str, steps: int = 40) -> str:
    global VARIANT, SCALER
    VARIANT = variant
    objs = build()
    model, opt = objs[0], objs[1]
    SCALER = objs[3] if len(objs) > 3 else None
    g = torch.Generator().manual_seed(1)
    x = torch.randn(steps * 16, 8, generator=g)
    y = (x[:, :4]).argmax(1)
    if variant == "saturated":
        x = x * 100.0  # raw-scale inputs: every tanh pinned at +-1
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        scaler=SCALER,
        snapshot_every=10,
        keep_snapshots=steps // 10,
        raise_on_nonfinite=False,
    ) as rec:
        for s in range(steps):
            rec.step((x[s * 16 : (s + 1) * 16], y[s * 16 : (s + 1) * 16]))
    return path

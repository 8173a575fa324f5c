"""A denoiser trained as diffusion models and masked autoencoders are: each step corrupts its
batch with noise drawn from a ``torch.Generator`` the program seeded once (``generator=gen``),
and a numpy ``Generator`` picks which features to mask. Both move at every step; the Recorder
keeps torch's, numpy's global and python's generators, not these.

``--hold``: both generators are given to the Recorder by name (``objects=``), so every snapshot
keeps their states and a replay from any snapshot draws what the run drew.

    python noise_generator.py run.h5 [--steps 40] [--hold]
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

FEATURES = 12


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--hold", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    noise_gen = torch.Generator().manual_seed(1234)
    mask_rng = np.random.default_rng(99)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.SiLU(), nn.Linear(32, FEATURES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(model, optimizer, batch):
        noise = torch.randn(batch.shape, generator=noise_gen)
        keep = torch.from_numpy(mask_rng.random(batch.shape[1]) > 0.25).float()
        loss = F.mse_loss(model((batch + noise) * keep), noise)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    held = {"noise_gen": noise_gen, "mask_rng": mask_rng} if args.hold else {}
    rec = replay.Recorder(
        args.out,
        objects={"model": model, "optimizer": optimizer, **held},
        step_fn=train_step,
        snapshot_every=10,
    )
    data = torch.randn(args.steps, 16, FEATURES)
    for i in range(args.steps):
        rec.step(data[i])
    rec.close()


if __name__ == "__main__":
    main()

"""A GAN whose critic is regularised with a gradient penalty on the real data (DRAGAN, and
WGAN-GP's penalty applied to real samples): ``(||d critic(x) / dx||_2 - 1)^2``, the norm written
as ``sqrt(sum(g ** 2))``. The penalty's gradient needs ``torch.autograd.grad(create_graph=True)``,
so the critic's update runs a double backward. Two networks, two Adam optimizers, one step.

The planted bug: at step ``--bad`` sample 3 of the real batch is blank (all zeros). The critic's
first layer has no bias, so its ReLUs are exactly at 0 there and the input gradient of that
sample is exactly 0: ``sqrt``'s derivative at 0 is infinite, and the double backward makes
``-inf`` (then NaN) in the critic's gradients. The loss of that step is still finite; the
parameters are NaN from the next step on.

    python gradient_penalty_gan.py run.h5 [--bad 10] [--steps 25]
"""

import argparse
import sys

import torch
import torch.nn as nn

import replay

DATA, NOISE, BATCH, PENALTY = 8, 4, 16, 10.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--bad", type=int, default=10)
    p.add_argument("--steps", type=int, default=25)
    args = p.parse_args()
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(NOISE, 32), nn.ReLU(), nn.Linear(32, DATA))
    critic = nn.Sequential(nn.Linear(DATA, 32, bias=False), nn.ReLU(), nn.Linear(32, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-4, betas=(0.5, 0.9))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.5, 0.9))

    def train_step(real):
        z = torch.randn(real.size(0), NOISE)
        fake = generator(z)
        x = real.clone().requires_grad_(True)
        grads = torch.autograd.grad(critic(x).sum(), x, create_graph=True)[0]
        penalty = ((torch.sqrt((grads**2).sum(1)) - 1) ** 2).mean()
        loss_c = critic(fake.detach()).mean() - critic(real).mean() + PENALTY * penalty
        opt_c.zero_grad()
        loss_c.backward()
        opt_c.step()
        loss_g = -critic(generator(z)).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        return loss_c

    objects = {"model": critic, "generator": generator, "opt_c": opt_c, "opt_g": opt_g}
    with replay.Recorder(args.out, objects=objects, step_fn=train_step) as rec:
        for step in range(args.steps):
            real = torch.randn(BATCH, DATA) * 0.5 + 1.0
            if step == args.bad:
                real[3] = 0.0  # a blank sample
            print(f"step {step} critic loss {float(rec.step(real)):.4f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)

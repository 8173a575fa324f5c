"""vae-shaped (pytorch/examples): an encoder gives ``mu`` and ``logvar``, ``reparameterize``
samples ``mu + eps * exp(0.5 * logvar)``, a decoder ends in a sigmoid, and the loss is
``binary_cross_entropy`` plus the KL term. With Adam at ``--lr 2.0`` ``logvar`` grows until
``exp`` overflows; the decoder's output turns NaN and ``binary_cross_entropy`` raises ("all
elements of input should be between 0 and 1"): the step dies in the loss, the cause was ``exp``.

    python vae_overflow.py run.h5 [--lr 2.0] [--steps 60]
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

PIXELS, HIDDEN, LATENT, BATCH = 64, 32, 8, 16


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(PIXELS, HIDDEN)
        self.fc21 = nn.Linear(HIDDEN, LATENT)
        self.fc22 = nn.Linear(HIDDEN, LATENT)
        self.fc3 = nn.Linear(LATENT, HIDDEN)
        self.fc4 = nn.Linear(HIDDEN, PIXELS)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, PIXELS))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, PIXELS), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--lr", type=float, default=2.0)
    p.add_argument("--steps", type=int, default=60)
    return p.parse_args()


ARGS = parse() if __name__ == "__main__" else None


def build():
    torch.manual_seed(1)
    model = VAE()
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=(ARGS or parse()).lr),
    }


def train_step(model, optimizer, batch):
    (data,) = batch
    optimizer.zero_grad()
    recon, mu, logvar = model(data)
    loss = loss_function(recon, data, mu, logvar)
    loss.backward()
    optimizer.step()
    return loss


if __name__ == "__main__":
    objects = build()
    g = torch.Generator().manual_seed(3)
    images = (torch.rand(ARGS.steps * BATCH, 1, 8, 8, generator=g) > 0.6).float()
    with replay.Recorder(sys.argv[1], objects=objects, step_fn=train_step, build_fn=build) as rec:
        for i in range(ARGS.steps):
            loss = rec.step((images[i * BATCH : (i + 1) * BATCH],))
            print(f"step {i} loss {loss.item():.1f}")

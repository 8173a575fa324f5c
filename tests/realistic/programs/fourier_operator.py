"""A Fourier neural operator (neuraloperator's FNO1d, in miniature) learning an antiderivative:
complex weights (``cfloat`` parameters) applied to the lowest modes of an ``rfft``, then
``irfft``, beside a pointwise convolution. ``--lr`` too high for plain SGD makes the spectral
weights grow until their complex product overflows.

    python fourier_operator.py run.h5 [--steps 30] [--lr 1e-3]
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay


class SpectralConv1d(nn.Module):
    def __init__(self, channels, modes):
        super().__init__()
        self.modes = modes
        scale = 1 / (channels * channels)
        self.weights = nn.Parameter(
            scale * torch.randn(channels, channels, modes, dtype=torch.cfloat)
        )

    def forward(self, x):
        x_ft = torch.fft.rfft(x)
        out_ft = torch.zeros(x.shape[0], x.shape[1], x.shape[-1] // 2 + 1, dtype=torch.cfloat)
        out_ft[:, :, : self.modes] = torch.einsum(
            "bix,iox->box", x_ft[:, :, : self.modes], self.weights
        )
        return torch.fft.irfft(out_ft, n=x.shape[-1])


class FNO1d(nn.Module):
    def __init__(self, channels=16, modes=8, layers=2):
        super().__init__()
        self.lift = nn.Conv1d(2, channels, 1)
        self.spectral = nn.ModuleList(SpectralConv1d(channels, modes) for _ in range(layers))
        self.pointwise = nn.ModuleList(nn.Conv1d(channels, channels, 1) for _ in range(layers))
        self.project = nn.Conv1d(channels, 1, 1)

    def forward(self, x):
        x = self.lift(x)
        for spectral, pointwise in zip(self.spectral, self.pointwise):
            x = F.gelu(spectral(x) + pointwise(x))
        return self.project(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()
    torch.manual_seed(0)
    model = FNO1d()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    def train_step(model, optimizer, batch):
        a, u = batch
        loss = F.mse_loss(model(a), u)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    rec = replay.Recorder(
        args.out,
        objects={"model": model, "optimizer": optimizer},
        step_fn=train_step,
        snapshot_every=5,
    )
    grid = torch.linspace(0, 1, 64).expand(8, 1, 64)
    g = torch.Generator().manual_seed(1)
    for _ in range(args.steps):
        f = torch.randn(8, 1, 64, generator=g)
        rec.step((torch.cat([f, grid], 1), f.cumsum(-1) / 64))  # u = the integral of f
    rec.close()


if __name__ == "__main__":
    main()

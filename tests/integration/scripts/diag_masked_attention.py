"""Causal self-attention whose mask is an intentional ``-inf`` (``masked_fill``); no query row
is fully masked, so training is healthy: bisect must find nothing.

    python diag_masked_attention.py OUT.h5 [--fully-masked]

With ``--fully-masked`` the batch also carries a key-padding mask, and at step BAD_STEP sample
BAD_SAMPLE is all padding: every row of its attention is masked, the softmax turns the ``-inf``
into NaN, and that softmax is the op to blame (not the mask).
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

STEPS, BAD_STEP, BAD_SAMPLE, BATCH, T, D = 10, 7, 2, 4, 6, 8
FULLY_MASKED = "--fully-masked" in sys.argv


def make_batch(t: int):
    g = torch.Generator().manual_seed(200 + t)
    x = torch.randn(BATCH, T, D, generator=g)
    y = torch.randn(BATCH, T, D, generator=g)
    if not FULLY_MASKED:
        return x, y
    keep = torch.ones(BATCH, T, dtype=torch.bool)
    keep[:, T - 1] = False  # the last key is padding in every sample
    if t == BAD_STEP:
        keep[BAD_SAMPLE] = False  # an empty sample: nothing to attend to
    return x, keep, y


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)

    def forward(self, x, keep=None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / D**0.5
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        if keep is not None:
            allowed = allowed & keep[:, None, :]
        scores = scores.masked_fill(~allowed, float("-inf"))  # MASK
        return self.out(torch.softmax(scores, dim=-1) @ v)  # SOFTMAX


def build():
    torch.manual_seed(0)
    model = Attention()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train_step(model, optimizer, batch):
    x, *keep, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x, *keep), y)
    loss.backward()
    optimizer.step()
    return loss


def main(path: str) -> None:
    model, optimizer = build()
    with replay.Recorder(
        path,
        model=model,
        optimizer=optimizer,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=5,
        keep_snapshots=3,
    ) as rec:
        try:
            for t in range(STEPS):
                rec.step(make_batch(t))
        except replay.NonFiniteLossError:
            pass


if __name__ == "__main__":
    main(sys.argv[1])

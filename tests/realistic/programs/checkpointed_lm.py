"""A small causal transformer LM trained with activation checkpointing, as HF's
``gradient_checkpointing_enable()`` and torchtitan's activation checkpointing run it: each block
goes through ``torch.utils.checkpoint.checkpoint``, so the backward runs the block's forward again
before its own backward (``--reentrant``: the older ``use_reentrant=True`` flavour, whose
original forward runs without autograd).

The planted bug: the loop hands the step a per-step attention temperature
(``rec.step(batch, temperature=...)``); at step ``--bad`` it is 1e39, which overflows float32,
so block 1's scaled scores are +/-inf and the softmax turns them into NaN.

    python checkpointed_lm.py run.h5 [--bad 12] [--steps 30] [--reentrant]
"""

import argparse
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import replay

VOCAB, DIM, CONTEXT, BATCH = 64, 32, 16, 8


class Block(nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc, self.out = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("mask", torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool), 1))

    def forward(self, x, temperature):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(DIM)
        if self.index == 1:
            scores = scores * temperature
        att = scores.masked_fill(self.mask, float("-inf")).softmax(-1)
        x = x + self.drop(self.proj(att @ v))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(i) for i in range(3))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx, temperature=1.0):
        x = self.embed(idx)
        for block in self.blocks:
            x = checkpoint(block, x, temperature, use_reentrant=self.reentrant)
        return self.head(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--bad", type=int, default=12)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--reentrant", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    model = LM(args.reentrant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (512, CONTEXT + 1))

    def train_step(batch, temperature=1.0):
        x, y = batch
        logits = model(x, temperature)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    with replay.Recorder(args.out, model=model, optimizer=optimizer, step_fn=train_step) as rec:
        for step in range(args.steps):
            rows = torch.randint(0, len(tokens), (BATCH,))
            temperature = 1e39 if step == args.bad else 1.0
            loss = rec.step((tokens[rows, :-1], tokens[rows, 1:]), temperature=temperature)
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)

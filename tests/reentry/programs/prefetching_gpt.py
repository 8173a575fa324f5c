"""A nanoGPT-shaped script: configuration as module globals, training at module level, batches
drawn by `torch.randint` offsets into a `np.memmap` of tokens, gradient accumulation over
micro-batches, a GradScaler (disabled on the CPU), clipping, AdamW with per-step lr.

`--prefetch`: the step trains on the batch the previous micro-step fetched into the globals
`X, Y` (nanoGPT's own loop); replays carried on from the first step, not from a later snapshot.
Otherwise the loop draws the step's micro-batches and hands them to `rec.step` (as
docs/recording.md says), and every snapshot replays. `--bad-step N`: the loss of step N is
made +inf (after the lr, before the backward).
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

steps, prefetch, out = 8, "--prefetch" in sys.argv, sys.argv[1]
bad_step = int(sys.argv[sys.argv.index("--bad-step") + 1]) if "--bad-step" in sys.argv else -1
block_size, batch_size, vocab, accumulation = 16, 4, 32, 2
learning_rate, warmup, grad_clip = 1e-3, 3, 1.0

tokens = os.path.join(os.path.dirname(os.path.abspath(out)), "train.bin")
if not os.path.exists(tokens):
    np.random.default_rng(0).integers(0, vocab, 5000).astype(np.uint16).tofile(tokens)


def get_batch():
    data = np.memmap(tokens, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix]
    )
    return x, y


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab, 32)
        self.ln = nn.LayerNorm(32)
        self.head = nn.Linear(32, vocab)

    def forward(self, idx, targets):
        logits = self.head(self.ln(self.wte(idx)))
        return logits, F.cross_entropy(logits.view(-1, vocab), targets.view(-1))


def get_lr(it):
    return (
        learning_rate * (it + 1) / (warmup + 1)
        if it < warmup
        else learning_rate * 0.5 * (1 + math.cos(math.pi * min(1.0, (it - warmup) / steps)))
    )


torch.manual_seed(1337)
model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95))
scaler = torch.amp.GradScaler("cpu", enabled=False)
X, Y = get_batch()


def train_step(batch, lr, it):
    global X, Y
    for group in optimizer.param_groups:
        group["lr"] = lr
    micro = [(X, Y)] if prefetch else batch
    for k in range(accumulation):
        x, y = micro[k] if not prefetch else (X, Y)
        _, loss = model(x, y)
        loss = loss / accumulation * (math.inf if it == bad_step else 1.0)
        if prefetch:
            X, Y = get_batch()
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss


rec = replay.Recorder(
    out,
    objects={"model": model, "optimizer": optimizer, "scaler": scaler},
    step_fn=train_step,
    snapshot_every=4,
)
for it in range(steps):
    batch = None if prefetch else [get_batch() for _ in range(accumulation)]
    rec.step(batch, lr=get_lr(it), it=it)
rec.close()

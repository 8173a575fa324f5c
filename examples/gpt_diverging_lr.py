"""A small GPT trained with a learning rate 20x too high: the loss falls, climbs, then turns NaN.

The bug: `LR = 2.0` where SGD with momentum on this transformer wants about 0.1. The easy
counting task is learnt in ten steps; then the oversized steps overshoot, every update makes the
next gradient larger (the gradient norm grows 10x every few steps), the weights explode and the
loss overflows to NaN at step 30. Lower the learning rate, add warm-up, or clip the gradient norm
(`torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)` before `optimizer.step()`).

Run:
    python examples/gpt_diverging_lr.py [runs/gpt_diverging_lr.h5]
    replay bisect runs/gpt_diverging_lr.h5
    replay doctor runs/gpt_diverging_lr.h5

Verdict: kind=nonfinite phase=forward op=aten::native_layer_norm module=h.0.ln_2
Doctor: grad_norm_exploding
"""

import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

# -- config -----------------------------------------------------------------------------------
SEED = 0
STEPS = 60
BATCH = 8
BLOCK = 16  # context length
VOCAB = 32
N_EMBD = 32
N_HEAD = 2
N_LAYER = 2
LR = 2.0  # the bug: about 0.1 is right for SGD with momentum here
SNAPSHOT_EVERY = 10

torch.manual_seed(SEED)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD)
        self.attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.proj = nn.Linear(N_EMBD, N_EMBD)
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.Sequential(
            nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD)
        )
        mask = torch.tril(torch.ones(BLOCK, BLOCK, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, BLOCK, BLOCK))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(N_EMBD, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // N_HEAD)
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, N_EMBD)
        self.wpe = nn.Embedding(BLOCK, N_EMBD)
        self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def make_data(n: int) -> torch.Tensor:
    """Token streams with structure to learn: each sequence counts up from a random start."""
    g = torch.Generator().manual_seed(SEED)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    return (start + torch.arange(BLOCK + 1)) % VOCAB


def build():
    model = GPT()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def train_step(model, optimizer, batch):
    idx = batch
    optimizer.zero_grad(set_to_none=True)
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    return loss


def main(path: str) -> None:
    data = make_data(STEPS * BATCH)
    model, optimizer = build()
    with replay.Recorder(
        path,
        model=model,
        optimizer=optimizer,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=SNAPSHOT_EVERY,
        keep_snapshots=STEPS // SNAPSHOT_EVERY,
    ) as rec:
        try:
            for step in range(STEPS):
                loss = rec.step(data[step * BATCH : (step + 1) * BATCH])
                if step % 10 == 0:
                    print(f"step {step:3d}  loss {loss.item():.4f}")
        except replay.NonFiniteLossError as e:
            print(f"training failed: {e}")
            return
    print(f"no failure in {STEPS} steps; recorded {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/gpt_diverging_lr.h5")

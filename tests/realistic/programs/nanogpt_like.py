"""A nanoGPT-train.py-shaped loop: globals overridden from ``key=value`` arguments at import,
the parameter count printed at import, gradient accumulation over micro-batches inside one
step, a GradScaler under bf16 autocast, ``clip_grad_norm_``, and the learning rate set on the
optimizer by the loop (warmup then cosine), outside the step.

    python nanogpt_like.py out=run.h5 max_iters=12
"""

import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

# -- config, overridable as key=value (nanoGPT's configurator, in miniature) -----------------
out = "run.h5"
max_iters = 12
gradient_accumulation_steps = 2
batch_size = 4
block_size = 16
vocab_size = 32
n_embd = 32
learning_rate = 6e-3
warmup_iters = 4
grad_clip = 1.0
for arg in sys.argv[1:]:
    key, _, val = arg.partition("=")
    globals()[key] = type(globals()[key])(val)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, 2, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def forward(self, x):
        h = self.ln_1(x)
        mask = torch.triu(torch.ones(x.size(1), x.size(1), dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


print(f"number of parameters: {sum(p.numel() for p in GPT().parameters()) / 1e3:.1f}K")


def build():
    torch.manual_seed(1337)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    return {"model": model, "optimizer": optimizer, "scaler": scaler}


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return learning_rate * 0.1 + 0.5 * (1 + math.cos(math.pi * ratio)) * learning_rate * 0.9


def train_step(model, optimizer, scaler, batch):
    """One optimizer step over ``gradient_accumulation_steps`` micro-batches."""
    X, Y = batch  # [micro, B, T]
    for micro in range(gradient_accumulation_steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(X[micro], Y[micro]) / gradient_accumulation_steps
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach() * gradient_accumulation_steps


def get_batch(g):
    data = torch.randint(
        0, vocab_size, (gradient_accumulation_steps, batch_size, block_size + 1), generator=g
    )
    return data[..., :-1].contiguous(), data[..., 1:].contiguous()


if __name__ == "__main__":
    objects = build()
    g = torch.Generator().manual_seed(0)
    with replay.Recorder(
        out, objects=objects, step_fn=train_step, build_fn=build, snapshot_every=4
    ) as rec:
        for it in range(max_iters):
            lr = get_lr(it)
            for group in objects["optimizer"].param_groups:
                group["lr"] = lr
            loss = rec.step(get_batch(g))
            print(f"iter {it}: loss {loss.item():.4f}, lr {lr:.2e}")

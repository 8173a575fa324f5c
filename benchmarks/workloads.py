"""The three benchmark workloads, shared by every benchmark: an MLP, a small CNN, a small GPT.

Each ``make()`` returns ``(model, batch)``; ``step`` is the training step they all use.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp():
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    return model, (torch.randn(128, 256), torch.randint(0, 10, (128,)))


def cnn():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )
    return model, (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)))


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.h = h

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).unbind(2)
        att = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)) / (d // self.h) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v.transpose(1, 2)).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=256, d=128, h=4, n=2, t=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(t, d)
        self.blocks = nn.Sequential(*[Block(d, h) for _ in range(n)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def gpt():
    idx = torch.randint(0, 256, (16, 65))
    return GPT(), (idx[:, :-1], idx[:, 1:])


def step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss


WORKLOADS = {"MLP": mlp, "CNN": cnn, "GPT (2 blocks)": gpt}


# ---------------------------------------------------------------- many small ops
class LSTMCellSeq(nn.Module):
    """time_sequence_prediction's model: two LSTMCells and a Linear unrolled step by step in
    Python, so a step is thousands of tiny aten ops (issue 33)."""

    def __init__(self, hidden: int = 51):
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, x):
        h1 = c1 = h2 = c2 = torch.zeros(x.size(0), self.hidden, dtype=x.dtype)
        outputs = []
        for input_t in x.split(1, dim=1):
            h1, c1 = self.lstm1(input_t, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            outputs.append(self.linear(h2))
        return torch.cat(outputs, dim=1)


def lstm_lbfgs(length: int = 40, samples: int = 16):
    """``(model, batch)`` of the many-small-ops workload; train it with ``lbfgs_step`` and
    ``torch.optim.LBFGS(..., max_iter=20)``: twenty closure calls per step."""
    torch.manual_seed(0)
    t = torch.arange(length + 1).unsqueeze(0) + torch.randint(-20, 20, (samples, 1))
    data = torch.sin(t / 4.0)
    return LSTMCellSeq(), (data[:, :-1].contiguous(), data[:, 1:].contiguous())


def lbfgs_step(model, optimizer, batch):
    x, y = batch

    def closure():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    return optimizer.step(closure)

"""A time-major language model: batches are ``tokens[T, B]``, ``targets[T, B]`` (a GRU with
``batch_first=False``). At step BAD_STEP, column BAD_COLUMN holds a padding token at time
BAD_TIME; the padding embedding is all zeros and the model normalises each embedding by its
norm: ``0 / 0 = NaN``. The culprit sample is column BAD_COLUMN (dim 1), not row BAD_TIME.

    python diag_time_major.py OUT.h5
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

STEPS, BAD_STEP, BAD_COLUMN, BAD_TIME, T, BATCH, VOCAB, PAD = 10, 7, 7, 3, 6, 10, 12, 0


def make_batch(t: int):
    g = torch.Generator().manual_seed(400 + t)
    tokens = torch.randint(1, VOCAB, (T + 1, BATCH), generator=g)
    x, y = tokens[:-1].clone(), tokens[1:].clone()
    if t == BAD_STEP:
        x[BAD_TIME, BAD_COLUMN] = PAD
    return x, y


class TimeMajorLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16, padding_idx=PAD)
        self.rnn = nn.GRU(16, 32)  # time-major: [T, B, F]
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x):
        h = self.emb(x)
        h = h / h.norm(dim=-1, keepdim=True)  # NORMALISE
        out, _ = self.rnn(h * 3.0)
        return self.head(out)


def build():
    torch.manual_seed(0)
    model = TimeMajorLM()
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
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

"""word_language_model-shaped (pytorch/examples): an LSTM language model on time-major batches
``data[T, B]`` whose targets are flattened, ``targets = source[i+1 : i+1+T].view(-1)`` (length
T*B), against ``output.view(-1, ntokens)``. One corpus token is out of range (a vocabulary
built on another split): it sits in column 7 of the batch at step ``--bad-step``, and the
embedding raises "index out of range in self".

    python lm_time_major.py run.h5 [--bad-step 3]
"""

import argparse

import torch
import torch.nn as nn

import replay

NTOKENS, EMSIZE, NHID, BPTT, BATCH, STEPS, BAD_COLUMN = 30, 12, 16, 5, 10, 6, 7


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(NTOKENS, EMSIZE)
        self.rnn = nn.LSTM(EMSIZE, NHID)
        self.decoder = nn.Linear(NHID, NTOKENS)

    def forward(self, data):
        output, _ = self.rnn(self.encoder(data))
        return self.decoder(output)


def build():
    torch.manual_seed(4)
    model = RNNModel()
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=5.0)}


def train_step(model, optimizer, batch):
    data, targets = batch
    optimizer.zero_grad()
    output = model(data)
    loss = nn.functional.cross_entropy(output.view(-1, NTOKENS), targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    optimizer.step()
    return loss


def batchify(bad_step):
    g = torch.Generator().manual_seed(8)
    source = torch.randint(0, NTOKENS, (STEPS * BPTT + 1, BATCH), generator=g)  # [T, B]
    source[bad_step * BPTT + 2, BAD_COLUMN] = NTOKENS + 3  # out of the vocabulary
    return source


def get_batch(source, i):
    data = source[i : i + BPTT]
    target = source[i + 1 : i + 1 + BPTT].reshape(-1)  # flattened: T*B
    return data, target


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--bad-step", type=int, default=3)
    args = p.parse_args()
    source = batchify(args.bad_step)
    objects = build()
    with replay.Recorder(args.out, objects=objects, step_fn=train_step, build_fn=build) as rec:
        for step in range(STEPS):
            loss = rec.step(get_batch(source, step * BPTT))
            print(f"step {step} loss {loss.item():.3f}")

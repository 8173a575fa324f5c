"""word_language_model-shaped: an LSTM language model on time-major batches ``[T, B]``, no
``torch.optim`` optimizer (``p.data.add_(p.grad, alpha=-lr)``), the hidden state carried from
batch to batch, gradient clipping, and the learning rate annealed by the loop. The lr and the
carried hidden state reach the step as per-step values, so replay hands them back.

    python manual_sgd_rnn.py run.h5
"""

import sys

import torch
import torch.nn as nn

import replay

NTOKENS, EMSIZE, NHID, BPTT, BATCH, STEPS, CLIP = 40, 16, 24, 6, 5, 12, 0.25


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(NTOKENS, EMSIZE)
        self.rnn = nn.LSTM(EMSIZE, NHID)
        self.decoder = nn.Linear(NHID, NTOKENS)

    def forward(self, data, hidden):
        output, hidden = self.rnn(self.encoder(data), hidden)
        return self.decoder(output).view(-1, NTOKENS), hidden


def build():
    torch.manual_seed(11)
    return {"model": RNNModel()}


def train_step(model, batch, lr, hidden):
    data, targets = batch
    model.zero_grad()
    output, hidden = model(data, hidden)
    loss = nn.functional.cross_entropy(output, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    return loss, tuple(h.detach() for h in hidden)


def batchify(g):
    data = torch.randint(0, NTOKENS, (STEPS * BPTT + 1, BATCH), generator=g)
    return data  # [T, B]: time-major


if __name__ == "__main__":
    objects = build()
    source = batchify(torch.Generator().manual_seed(0))
    lr = 20.0
    hidden = (torch.zeros(1, BATCH, NHID), torch.zeros(1, BATCH, NHID))
    with replay.Recorder(
        sys.argv[1], objects=objects, step_fn=train_step, build_fn=build, snapshot_every=4
    ) as rec:
        for i in range(STEPS):
            data = source[i * BPTT : (i + 1) * BPTT]
            targets = source[i * BPTT + 1 : (i + 1) * BPTT + 1].reshape(-1)
            loss, hidden = rec.step((data, targets), lr=lr, hidden=hidden)
            if i % 4 == 3:
                lr /= 4.0  # annealed by the loop

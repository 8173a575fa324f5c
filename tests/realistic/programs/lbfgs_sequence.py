"""time_sequence_prediction-shaped (pytorch/examples): two LSTMCells and a Linear unrolled over
sine waves, trained with LBFGS, whose ``optimizer.step(closure)`` calls the closure many times in
one step. With ``--lr 1e200`` the first update throws the weights far out and the forward
``mse_loss`` of the second closure call overflows to +inf; the backward ops only see it later.

    python lbfgs_sequence.py run.h5 [--lr 0.8] [--steps 4] [--length 24] [--max-iter 20]
"""

import argparse
import sys

import torch
import torch.nn as nn

import replay

HIDDEN, SAMPLES, LENGTH = 12, 6, 24


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, HIDDEN)
        self.lstm2 = nn.LSTMCell(HIDDEN, HIDDEN)
        self.linear = nn.Linear(HIDDEN, 1)

    def forward(self, x):
        h1 = c1 = torch.zeros(x.size(0), HIDDEN, dtype=x.dtype)
        h2 = c2 = torch.zeros(x.size(0), HIDDEN, dtype=x.dtype)
        outputs = []
        for input_t in x.split(1, dim=1):
            h1, c1 = self.lstm1(input_t, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            outputs.append(self.linear(h2))
        return torch.cat(outputs, dim=1)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--lr", type=float, default=0.8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--max-iter", type=int, default=20)
    p.add_argument("--length", type=int, default=LENGTH)
    return p.parse_args()


ARGS = parse() if __name__ == "__main__" else None


def build():
    torch.manual_seed(0)
    args = ARGS or parse()
    model = Sequence().double()  # as the example: float64 throughout
    optimizer = torch.optim.LBFGS(model.parameters(), lr=args.lr, max_iter=args.max_iter)
    return {"model": model, "optimizer": optimizer}


def train_step(model, optimizer, batch):
    x, y = batch
    criterion = nn.MSELoss()

    def closure():
        optimizer.zero_grad()
        out = model(x)
        loss = criterion(out, y)
        print("loss:", loss.item())
        loss.backward()
        return loss

    return optimizer.step(closure)


def waves(length=LENGTH):
    g = torch.Generator().manual_seed(2)
    shift = torch.randint(-20, 20, (SAMPLES, 1), generator=g)
    t = torch.arange(length + 1).unsqueeze(0) + shift
    data = torch.sin(t / 4.0)
    data = data.double()
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


if __name__ == "__main__":
    objects = build()
    batch = waves(ARGS.length)
    with replay.Recorder(sys.argv[1], objects=objects, step_fn=train_step, build_fn=build) as rec:
        for _ in range(ARGS.steps):
            loss = rec.step(batch)
            if not torch.isfinite(loss):
                break

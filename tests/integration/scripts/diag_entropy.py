"""An entropy bonus ``-(p * log p)``: at step BAD_STEP the inputs are huge, the softmax saturates,
a probability underflows to exactly 0, ``log(0) = -inf`` and ``0 * -inf = NaN``. The op to blame
is ``aten::log``; ``aten::mul`` is where the NaN appeared.

    python diag_entropy.py OUT.h5
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

STEPS, BAD_STEP, BATCH, N_ACTIONS = 10, 6, 8, 5


def make_batch(t: int):
    g = torch.Generator().manual_seed(100 + t)
    x = torch.randn(BATCH, 4, generator=g)
    if t == BAD_STEP:
        x = x * 1000.0  # saturates the softmax: some probabilities are exactly 0
    return x, torch.randint(0, N_ACTIONS, (BATCH,), generator=g)


def build():
    torch.manual_seed(0)
    model = nn.Linear(4, N_ACTIONS)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    probs = torch.softmax(model(x), dim=-1)
    entropy = -(probs * torch.log(probs)).sum(-1).mean()  # ENTROPY
    loss = F.nll_loss(torch.log(probs + 1e-6), y) - 0.01 * entropy
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

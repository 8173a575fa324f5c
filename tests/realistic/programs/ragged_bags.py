"""A bag-of-words classifier on ragged batches, as text pipelines pack them: the tokens of every
sample concatenated into one flat tensor ``tokens[N]``, with ``lengths[B]`` and ``labels[B]``;
the model splits the flat tokens by the lengths and mean-pools each sample's embeddings. At
step ``--bad-step`` sample BAD_SAMPLE holds a token out of the vocabulary and the embedding
raises "index out of range in self".

The flat tokens cannot be cut along the sample axis (their length is the sum of the lengths,
not the batch size): any sub-batch keeps all of them and its lengths no longer add up, so
``split`` raises instead. The samples search must say so, not name a sample.

    python ragged_bags.py run.h5 [--bad-step 2]
"""

import argparse

import torch
import torch.nn as nn

import replay

VOCAB, DIM, CLASSES, BATCH, STEPS, BAD_SAMPLE = 40, 8, 3, 6, 4, 4


class BagModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens, lengths):
        pieces = tokens.split(lengths.tolist())
        pooled = torch.stack([self.emb(p).mean(0) for p in pieces])
        return self.head(pooled)


def build():
    torch.manual_seed(6)
    model = BagModel()
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}


def train_step(model, optimizer, batch):
    tokens, lengths, labels = batch
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(tokens, lengths), labels)
    loss.backward()
    optimizer.step()
    return loss


def make_batch(step, bad_step):
    g = torch.Generator().manual_seed(20 + step)
    lengths = torch.randint(2, 6, (BATCH,), generator=g)
    tokens = torch.randint(0, VOCAB, (int(lengths.sum()),), generator=g)
    if step == bad_step:
        tokens[int(lengths[:BAD_SAMPLE].sum())] = VOCAB + 5  # first token of BAD_SAMPLE
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    return tokens, lengths, labels


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--bad-step", type=int, default=2)
    args = p.parse_args()
    objects = build()
    with replay.Recorder(args.out, objects=objects, step_fn=train_step, build_fn=build) as rec:
        for step in range(STEPS):
            loss = rec.step(make_batch(step, args.bad_step))
            print(f"step {step} loss {loss.item():.3f}")

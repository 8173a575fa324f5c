"""Sequence-to-sequence translation with padding masks, shaped like pytorch/examples'
``language_translation`` (``main.py`` with ``src/model.py`` and ``src/data.py``): source and
target sentences of different lengths padded into time-major batches ``[T, B]``
(``pad_sequence``), an ``nn.Transformer`` fed a causal target mask (float, ``-inf`` above the
diagonal: intentional, not a failure) and boolean key-padding masks for the source, the target
and the memory, ``CrossEntropyLoss(ignore_index=PAD)``. The corpus is synthetic (the example
downloads Multi30k and tokenises it with spaCy): a "translation" repeats the source tokens
reversed up to a length of its own.

Before its Recorder the program makes its logging folder and log (``logging.basicConfig`` to
``logs/log.txt``, appended to) and logs there; it saves ``logs/last.pt`` after each epoch. A
replay runs the start-up again: the log and checkpoint must stay as they were.

Wired for replay as a user would add it to ``train()``: the Recorder is made in ``main()``; the
body of the batch loop becomes a step taking ``(src, tgt)``, handed over with
``replay.step((src, tgt), step)``.

Two things happen at step ``--bad`` to sample 5 (``--bug``):

- ``blank``: its source sentence is blank and the pipeline adds no ``<bos>``/``<eos>`` to a
  blank line, so that column of the batch is all padding and every key of its attention rows
  is masked. Not a failure (torch's attention gives such rows zeros): the run is healthy and
  must replay bitwise, the intentional ``-inf`` of the masks named nowhere;
- ``token``: its target holds a token the vocabulary does not have (one built on another
  split): the target embedding raises "index out of range in self". Bisect must name the step,
  the exception in ``aten::embedding`` and sample 5, found along dim 1 of the time-major batch.

    python seq2seq_padding.py [--bug blank|token] [--bad 9] [--epochs 1]
"""

import argparse
import logging
import os
import sys

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pad_sequence

import replay

PAD, BOS, EOS, VOCAB, BATCH = 1, 2, 3, 40, 8


class Translator(nn.Module):
    def __init__(self, embed_size=32, num_heads=4, layers=2):
        super().__init__()
        self.src_embedding = nn.Embedding(VOCAB, embed_size)
        self.tgt_embedding = nn.Embedding(VOCAB, embed_size)
        self.transformer = nn.Transformer(embed_size, num_heads, layers, layers, 64, dropout=0.1)
        self.ff = nn.Linear(embed_size, VOCAB)

    def forward(self, src, trg, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask):
        outs = self.transformer(self.src_embedding(src), self.tgt_embedding(trg), src_mask,
                                tgt_mask, None, src_padding_mask, tgt_padding_mask,
                                src_padding_mask)  # fmt: skip
        return self.ff(outs)


def generate_square_subsequent_mask(size):
    mask = (torch.triu(torch.ones((size, size))) == 1).transpose(0, 1)
    return mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, 0.0)


def create_mask(src, tgt):
    src_mask = torch.zeros((src.shape[0], src.shape[0])).type(torch.bool)
    tgt_mask = generate_square_subsequent_mask(tgt.shape[0])
    return src_mask, tgt_mask, (src == PAD).transpose(0, 1), (tgt == PAD).transpose(0, 1)


def corpus(n_batches, bad, bug):
    """Batches of (src, tgt) pairs, collated as the example's ``_collate_fn`` does."""
    g = torch.Generator().manual_seed(0)
    for b in range(n_batches):
        src_batch, tgt_batch = [], []
        for i in range(BATCH):
            tokens = torch.randint(4, VOCAB, (int(torch.randint(3, 9, (), generator=g)),),
                                   generator=g)  # fmt: skip
            here = b == bad and i == 5
            src = torch.cat([torch.tensor([BOS]), tokens, torch.tensor([EOS])])
            n_out = int(torch.randint(3, 12, (), generator=g))  # a length of its own
            out = tokens.flip(0).repeat(3)[:n_out]
            tgt = torch.cat([torch.tensor([BOS]), out, torch.tensor([EOS])])
            if here and bug == "blank":
                src = torch.full((3,), PAD)
            if here and bug == "token":
                tgt[2] = VOCAB + 3
            src_batch.append(src)
            tgt_batch.append(tgt)
        yield pad_sequence(src_batch, padding_value=PAD), pad_sequence(tgt_batch, padding_value=PAD)


def train(model, batches, loss_fn, optim):
    losses = 0.0
    model.train()
    for src, tgt in batches:

        def step(batch):
            src, tgt = batch
            tgt_input = tgt[:-1, :]
            src_mask, tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt_input)
            logits = model(src, tgt_input, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask)
            optim.zero_grad()
            tgt_out = tgt[1:, :]
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
            loss.backward()
            optim.step()
            return loss

        losses += replay.step((src, tgt), step).item()
    return losses


def main(opts):
    os.makedirs(opts.logging_dir, exist_ok=True)
    logging.basicConfig(filename=os.path.join(opts.logging_dir, "log.txt"), level=logging.INFO)
    logging.info("Translation task: src -> tgt")
    torch.manual_seed(0)
    model = Translator()
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=PAD)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    replay.Recorder("run.h5", objects={"model": model, "optimizer": optim}, snapshot_every=5)
    batches = list(corpus(opts.batches, opts.bad, opts.bug))
    for epoch in range(1, opts.epochs + 1):
        train_loss = train(model, batches, loss_fn, optim)
        torch.save(model.state_dict(), os.path.join(opts.logging_dir, "last.pt"))
        logging.info(f"Epoch: {epoch} Train loss: {train_loss:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batches", type=int, default=14)
    parser.add_argument("--bad", type=int, default=9)
    parser.add_argument("--bug", choices=["blank", "token"], default="token")
    parser.add_argument("--logging_dir", default="logs")
    try:
        main(parser.parse_args())
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)

"""Contrastive image-text training, shaped like open_clip's ``open_clip_train/train.py``
(``train_one_epoch``): a two-tower CLIP model whose forward returns normalised image and text
features and ``logit_scale.exp()``, the symmetric cross-entropy over the batch's similarity
matrix (labels ``arange(n)``), AdamW with a no-decay group, a cosine learning rate set by hand
before each step, and ``--accum-freq`` batches per optimizer step done open_clip's way: the
features of every micro-batch first computed under ``no_grad`` and cached, then each
micro-batch run again with gradients against the cached features of the others as negatives,
one backward each, one optimizer step at the end; after it the loop clamps ``logit_scale`` to
``ln(100)``. Synthetic captions (token ids, 0 pads, mean-pooled over the tokens that are not
padding) that match their image one to one; the example reads webdataset shards.

Wired for replay as the accumulation asks: a step is the ``--accum-freq`` micro-batches (the
list is the step's batch), so the caching moves into the step function (``--wiring batch``,
the default). ``--wiring closure`` keeps open_clip's order: the loop caches each micro-batch's
features as it arrives and the step closes over that cache, state the loop fills between
steps that no recording holds: it does not replay, and the self-check says so
(``--until-checked`` trains epoch after epoch until the check has said its word).

Before its Recorder the program writes ``train.log`` (a line per step) and ``params.json``.

The planted failure: ``--empty-caption I`` makes sample I's caption all padding (an empty
caption in the data), whose masked mean divides 0 by 0 (``aten::div`` on the line marked
``# masked mean``): the loss is NaN at the first step holding it (step 13, micro-batch 1,
row 5 for ``--empty-caption 37``). Without it the run is healthy.

    python clip_contrastive.py [--record run.h5] [--steps 20] [--accum-freq 2]
                               [--empty-caption I] [--wiring batch|closure] [--until-checked]
"""

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import replay  # replay

IMG_DIM, VOCAB, CTX, EMBED, PAD = 48, 64, 6, 32, 0


class CLIP(nn.Module):
    def __init__(self):
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(IMG_DIM, 64), nn.GELU(), nn.Linear(64, EMBED))
        self.token_embedding = nn.Embedding(VOCAB, 48)
        self.text_proj = nn.Sequential(nn.LayerNorm(48), nn.Linear(48, EMBED))
        self.logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.07))

    def encode_text(self, text):
        mask = (text != PAD).unsqueeze(-1).float()  # padding left out of the pooled mean
        pooled = (self.token_embedding(text) * mask).sum(dim=1) / mask.sum(dim=1)  # masked mean
        return self.text_proj(pooled)

    def forward(self, image, text):
        return {
            "image_features": F.normalize(self.visual(image), dim=-1),
            "text_features": F.normalize(self.encode_text(text), dim=-1),
            "logit_scale": self.logit_scale.exp(),  # logit scale
        }


def clip_loss(image_features, text_features, logit_scale):
    logits_per_image = logit_scale * image_features @ text_features.T
    logits_per_text = logit_scale * text_features @ image_features.T
    labels = torch.arange(logits_per_image.shape[0], dtype=torch.long)
    return (
        F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)
    ) / 2


def make_data(n, seed=0, empty=()):
    """Pairs that match one to one: each caption's tokens (1..VOCAB-1, 0 pads) are drawn
    around its image's code; a caption in ``empty`` is all padding (an empty caption)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, IMG_DIM, generator=g)
    code = (images[:, :CTX] > 0).long() * (VOCAB // 2)
    texts = 1 + code + torch.randint(0, 4, (n, CTX), generator=g) + torch.arange(CTX) * 4
    texts[:, -2:] = PAD  # captions shorter than the context
    for i in empty:
        texts[i] = PAD
    return torch.utils.data.TensorDataset(images, texts)


def cosine_lr(optimizer, base_lr, warmup, steps):
    def _lr_adjuster(step):
        if step < warmup:
            lr = base_lr * (step + 1) / warmup
        else:
            lr = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup))) * base_lr
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    return _lr_adjuster


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", default="run.h5")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accum-freq", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--empty-caption", type=int, action="append", default=[])
    parser.add_argument("--wiring", choices=("batch", "closure"), default="batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--until-checked", action="store_true")
    args = parser.parse_args()

    with open("params.json", "w") as f:
        json.dump(vars(args), f)
    log = open("train.log", "w")  # noqa: SIM115 - open for the whole run, as a logger's file

    torch.manual_seed(args.seed)
    model = CLIP()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": rest, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.2}],
        lr=args.lr, betas=(0.9, 0.98), eps=1e-6,
    )  # fmt: skip
    n = args.steps * args.accum_freq * args.batch_size
    dataloader = torch.utils.data.DataLoader(
        make_data(n, empty=args.empty_caption),
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
    )
    scheduler = cosine_lr(optimizer, args.lr, 3, args.steps)
    replay.Recorder(args.record, objects={"model": model, "optimizer": optimizer})  # replay

    accum_features = {}  # the loop's cache (--wiring closure)

    def cache(images, texts, into):
        with torch.no_grad():
            model_out = model(images, texts)
            model_out.pop("logit_scale")
            for key, val in model_out.items():
                into.setdefault(key, []).append(val)

    def train_step(accum):  # replay (was the update part of the loop's body)
        if args.wiring == "batch":
            features = {}
            for images, texts in accum:
                cache(images, texts, features)
        else:
            features = accum_features
        optimizer.zero_grad()
        for j, (images, texts) in enumerate(accum):
            model_out = model(images, texts)
            logit_scale = model_out.pop("logit_scale")
            inputs = {
                key: torch.cat(val[:j] + [model_out[key]] + val[j + 1 :])
                for key, val in features.items()
            }
            total_loss = clip_loss(**inputs, logit_scale=logit_scale)
            total_loss.backward()
        optimizer.step()
        return total_loss  # replay

    step, accum = 0, []
    deadline = time.monotonic() + 300
    while True:
        for i, (images, texts) in enumerate(dataloader):
            if not accum:
                scheduler(step)
            if args.wiring == "closure":
                cache(images, texts, accum_features)
            accum.append((images, texts))
            if (i + 1) % args.accum_freq > 0:
                continue
            loss = replay.step(accum, train_step)  # replay
            accum = []
            accum_features.clear()
            with torch.no_grad():
                model.logit_scale.clamp_(0, math.log(100))
            scale = model.logit_scale.exp().item()
            print(f"step {step} loss {loss.item():.5f} scale {scale:.3f}", file=log, flush=True)
            step += 1
        if not args.until_checked or checked() or time.monotonic() > deadline:
            break


def checked():
    """The background self-check has said its word (``--until-checked``)."""
    try:
        with open("run.selfcheck.json") as f:
            return json.load(f)["status"] != "running"
    except (OSError, ValueError, KeyError):
        return False


if __name__ == "__main__":
    main()

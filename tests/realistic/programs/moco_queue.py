"""moco-shaped (He et al.'s momentum contrast): a query encoder trained by SGD, a key encoder
that follows it by a momentum update, and a queue of past keys as negatives, written in place
each step at a moving pointer.

``--shape attributes`` (the default): the queue and its pointer are plain attributes of the
model (``self.queue = ...``, ``self.ptr = 0``), as many re-implementations keep them. They are
in no ``state_dict``, so no snapshot holds them: a replay from a snapshot reads another queue.
``--shape buffers``: both registered as buffers (``register_buffer``), as the reference code
does; the snapshots hold them and every step replays.

    python moco_queue.py run.h5 [--steps 40] [--shape attributes|buffers]
"""

import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

DIM, FEATURES, QUEUE, BATCH, TEMPERATURE = 16, 16, 64, 8, 0.07


class MoCo(nn.Module):
    def __init__(self, buffers):
        super().__init__()
        self.encoder_q = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, FEATURES))
        self.encoder_k = copy.deepcopy(self.encoder_q)
        for p in self.encoder_k.parameters():
            p.requires_grad = False
        queue = F.normalize(torch.randn(FEATURES, QUEUE), dim=0)
        if buffers:
            self.register_buffer("queue", queue)
            self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        else:
            self.queue = queue
            self.ptr = 0

    @torch.no_grad()
    def momentum_update(self):
        for q, k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            k.mul_(0.99).add_(q, alpha=0.01)

    @torch.no_grad()
    def enqueue(self, keys):
        ptr = int(self.ptr)
        self.queue[:, ptr : ptr + keys.shape[0]] = keys.T
        if isinstance(self.ptr, torch.Tensor):
            self.ptr.fill_((ptr + keys.shape[0]) % QUEUE)
        else:
            self.ptr = (ptr + keys.shape[0]) % QUEUE

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self.momentum_update()
            k = F.normalize(self.encoder_k(im_k), dim=1)
        positive = (q * k).sum(1, keepdim=True)
        negative = q @ self.queue.clone().detach()
        logits = torch.cat([positive, negative], dim=1) / TEMPERATURE
        self.enqueue(k)
        return logits, torch.zeros(logits.shape[0], dtype=torch.long)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--shape", choices=["attributes", "buffers"], default="attributes")
    args = p.parse_args()
    torch.manual_seed(0)
    model = MoCo(buffers=args.shape == "buffers")
    optimizer = torch.optim.SGD(model.encoder_q.parameters(), lr=0.03, momentum=0.9)

    def train_step(views):
        logits, labels = model(*views)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    with replay.Recorder(args.out, model=model, optimizer=optimizer, step_fn=train_step) as rec:
        for step in range(args.steps):
            x = torch.randn(BATCH, DIM)
            views = (x + 0.1 * torch.randn(BATCH, DIM), x + 0.1 * torch.randn(BATCH, DIM))
            print(f"step {step} loss {rec.step(views).item():.4f}", flush=True)


if __name__ == "__main__":
    main()

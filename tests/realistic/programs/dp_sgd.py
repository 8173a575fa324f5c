"""DP-SGD written with torch.func, as PyTorch's per-sample-gradients tutorial and Opacus's
functorch mode do it: per-sample gradients from ``vmap(grad(loss_of_one_sample))`` over
``functional_call``, each sample's gradient clipped to norm ``--clip``, Gaussian noise from
``torch.normal`` added, the sum set as ``.grad`` and an SGD step taken.

The planted bug: one feature of sample 5 of the batch at step ``--bad`` is +inf (a corrupted
record). Its per-sample gradient is NaN, and so is the summed one: the parameters are NaN
after that step.

    python dp_sgd.py run.h5 [--bad 8] [--steps 20]
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import replay

FEATURES, CLASSES, BATCH = 10, 3, 16


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--bad", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--sigma", type=float, default=0.5)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_of_one(params, buffers, x, y):
        out = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(out, y.unsqueeze(0))

    per_sample_grads = vmap(grad(loss_of_one), in_dims=(None, None, 0, 0))

    def train_step(batch):
        x, y = batch
        params = {k: v.detach() for k, v in model.named_parameters()}
        buffers = {k: v.detach() for k, v in model.named_buffers()}
        grads = per_sample_grads(params, buffers, x, y)
        norms = torch.sqrt(sum((g.flatten(1) ** 2).sum(1) for g in grads.values()))
        scale = (args.clip / (norms + 1e-6)).clamp(max=1.0)
        for name, param in model.named_parameters():
            g = grads[name]
            clipped = (g * scale.view(-1, *[1] * (g.dim() - 1))).sum(0)
            noise = torch.normal(0.0, args.sigma * args.clip, size=clipped.shape)
            param.grad = (clipped + noise) / x.shape[0]
        optimizer.step()
        with torch.no_grad():
            return F.cross_entropy(model(x), y)

    with replay.Recorder(args.out, model=model, optimizer=optimizer, step_fn=train_step) as rec:
        for step in range(args.steps):
            x, y = torch.randn(BATCH, FEATURES), torch.randint(0, CLASSES, (BATCH,))
            if step == args.bad:
                x[5, 2] = float("inf")
            print(f"step {step} loss {float(rec.step((x, y))):.4f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except replay.NonFiniteLossError as e:
        print(e, file=sys.stderr)
        sys.exit(3)

"""An encoder/decoder run with two optimizers, several param groups each, and both schedules
stepped by the loop outside the step function (so only the recording knows them per step):

- the encoder's Adam: weights (lr 1e-2, weight decay 1e-4) and biases (lr 5e-3, none), a
  LambdaLR decaying each group by 0.9 a step;
- the decoder's SGD (``optD``, a named object): weights (lr 0.05, momentum 0.9) and biases
  (lr 0.02, momentum 0.5), its lr halved every 3 steps (StepLR) and its weights' momentum set
  by hand each step.

    python two_optimizers.py OUT.h5 [--steps N]

Prints, as JSON, each step's hyper-parameters as the step saw them:
``{step: {"optimizer": [group, ...], "optD": [group, ...]}}``, a group being its numbers.
"""

import argparse
import json

import torch
import torch.nn as nn

import replay


def numbers(opt):
    out = []
    for g in opt.param_groups:
        row = {}
        for k, v in g.items():
            if k == "params":
                continue
            if isinstance(v, (list, tuple)):
                row.update({f"{k}.{i}": float(x) for i, x in enumerate(v)})
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                row[k] = float(v)
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    torch.manual_seed(0)
    enc, dec = nn.Linear(6, 3), nn.Linear(3, 6)
    model = nn.Sequential(enc, dec)
    opt = torch.optim.Adam(
        [
            {"params": [enc.weight], "lr": 1e-2, "weight_decay": 1e-4},
            {"params": [enc.bias], "lr": 5e-3},
        ]
    )
    optD = torch.optim.SGD(
        [
            {"params": [dec.weight], "lr": 0.05, "momentum": 0.9},
            {"params": [dec.bias], "lr": 0.02, "momentum": 0.5},
        ]
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.9**t)
    schedD = torch.optim.lr_scheduler.StepLR(optD, step_size=3, gamma=0.5)

    def step(batch):
        opt.zero_grad()
        optD.zero_grad()
        loss = ((model(batch) - batch) ** 2).mean()
        loss.backward()
        opt.step()
        optD.step()
        return loss

    seen = {}
    objects = {"model": model, "optimizer": opt, "scheduler": sched, "optD": optD, "schedD": schedD}
    with replay.Recorder(args.out, objects=objects, step_fn=step) as rec:
        for t in range(args.steps):
            optD.param_groups[0]["momentum"] = 0.9 - 0.05 * t
            seen[t] = {"optimizer": numbers(opt), "optD": numbers(optD)}
            rec.step(torch.randn(8, 6, generator=torch.Generator().manual_seed(t)))
            sched.step()
            schedD.step()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()

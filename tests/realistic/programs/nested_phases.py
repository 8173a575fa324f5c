"""Greedy layer-wise training whose step reaches its layer through a helper made per phase:
``step = make_step(make_forward(layer), opt)``, whose ``step(x)`` calls ``forward(x)``. At phase 1 the
step's closure holds another ``forward``, over another layer: a nested function, which a replay
cannot make again from the record (a closure over the layer itself, or over tensors, it can:
layer_local.py). The recorder says so while it trains, and verify names that step as why its
replay differs.

    python nested_phases.py [STEPS_PER_PHASE]
"""

import sys

import torch

import replay


def make_forward(layer):
    return lambda x: layer(x).pow(2).mean()


def make_step(forward, opt):
    def step(x):
        opt.zero_grad()
        loss = forward(x)
        loss.backward()
        opt.step()
        return loss

    return step


def main(per_phase):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = replay.Recorder("run.h5", model=model, optimizer=opt)
    g = torch.Generator().manual_seed(1)
    for layer in model:
        step = make_step(make_forward(layer), opt)
        for _ in range(per_phase):
            rec.step(torch.randn(8, 4, generator=g), step)
    rec.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)

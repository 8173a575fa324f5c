"""A torch.compile'd model whose compiled code and eager code disagree: its forward adds
sqrt(-gap), gap an input column put through float16 and back ((c + 1) - 1). Eager rounds each
op to float16, so a tiny positive c gives gap 0 and sqrt(-0) = -0; inductor keeps the fused
intermediates in float32 (its emulate_precision_casts is off), so gap = c and sqrt(-c) is NaN.
argv[1] = N puts c = 1e-4 into one sample of step N: the compiled run's loss is NaN there, the
same step run eagerly is finite."""

import sys

import torch
import torch.nn.functional as F

import replay

bad = int(sys.argv[1]) if len(sys.argv) > 1 else -1


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        gap = ((c.half() + 1) - 1).float()
        return self.lin(x) + torch.sqrt(-gap)


torch.manual_seed(0)
net = Net()
model = torch.compile(net)
opt = torch.optim.SGD(net.parameters(), lr=0.1)


def step(batch):
    x, c, y = batch
    opt.zero_grad()
    loss = F.mse_loss(model(x, c), y)
    loss.backward()
    opt.step()
    return loss


g = torch.Generator().manual_seed(1)
with replay.Recorder(
    "run.h5", objects={"model": model, "optimizer": opt}, step_fn=step, snapshot_every=4
) as rec:
    for i in range(6):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        c = -torch.rand(4, 1, generator=g)
        if i == bad:
            c[2] = 1e-4
        rec.step((x, c, y))

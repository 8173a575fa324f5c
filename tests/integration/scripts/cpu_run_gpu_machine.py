"""A CPU run on a machine that has GPUs: ``torch.cuda`` says two devices are there, and CUDA
being initialised in this process (``torch.cuda._lazy_init``, which naming a device, reading its
memory or its RNG calls) raises and is counted. The run trains on the CPU; what it printed last
is the JSON list of where CUDA was initialised from (empty: never).

    python cpu_run_gpu_machine.py RUN.h5
"""

import json
import sys
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

INITS: list[str] = []


def _counted_init() -> None:
    INITS.append("".join(traceback.format_stack(limit=6)))
    raise RuntimeError("CUDA was initialised in a CPU run's process")


torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 2
torch.cuda._lazy_init = _counted_init


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(batch):
        x, y = batch
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    objects = {"model": model, "optimizer": opt}
    with replay.Recorder(sys.argv[1], objects=objects, step_fn=step, self_check=False) as rec:
        for _ in range(12):
            rec.step((torch.randn(4, 8), torch.randint(0, 2, (4,))))
    print(json.dumps(INITS))


if __name__ == "__main__":
    main()

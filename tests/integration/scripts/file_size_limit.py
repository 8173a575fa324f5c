"""A run whose files may not grow past a limit (``RLIMIT_FSIZE``, SIGXFSZ ignored: each write
past it fails with EFBIG, as on a full disk), inherited by the recorder's writer process.

    python file_size_limit.py RUN.h5 LIMIT_BYTES

Trains 200 steps under a Recorder and prints the JSON list of its losses.
"""

import atexit
import json
import resource
import signal
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
_WAS = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), _WAS[1]))
atexit.register(resource.setrlimit, resource.RLIMIT_FSIZE, _WAS)  # (coverage's data file at exit)


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(batch):
        x, y = batch
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    losses = []
    objects = {"model": model, "optimizer": opt}
    with replay.Recorder(sys.argv[1], objects=objects, step_fn=step, self_check=False) as rec:
        for _ in range(200):
            losses.append(float(rec.step((torch.randn(32, 64), torch.randint(0, 2, (32,))))))
    print(json.dumps(losses))


if __name__ == "__main__":
    main()

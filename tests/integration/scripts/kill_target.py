"""A fork server of training runs for the kill -9 test: torch is imported once, each run forks.

Reads lines ``RUN OUT.h5 KIND SEED`` on stdin and answers each with the forked child's pid. The
child trains under a Recorder and, each time ``rec.step`` returns, stores the number of completed
steps in ``OUT.h5.progress`` (8 bytes, little-endian): the test's own account of what finished,
kept by the loop and not by the recorder. ``KIND`` is ``fast`` (sub-millisecond steps) or
``slow`` (a larger batch and a few milliseconds a step). The parent never runs a torch op, so
forking it is safe.
"""

import os
import signal
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import replay


def build_fast():
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def build_slow():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train_step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def make_batch(kind: str, t: int):
    g = torch.Generator().manual_seed(t)
    if kind == "fast":
        return torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    return torch.randn(256, 64, generator=g), torch.randint(0, 10, (256,), generator=g)


def train(out: str, kind: str) -> None:
    torch.set_num_threads(1)
    model, opt = build_fast() if kind == "fast" else build_slow()
    build = build_fast if kind == "fast" else build_slow
    progress = os.open(out + ".progress", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with replay.Recorder(
        out, model=model, optimizer=opt, step_fn=train_step, build_fn=build, snapshot_every=20
    ) as rec:
        for t in range(10**9):
            rec.step(make_batch(kind, t))
            os.pwrite(progress, struct.pack("<q", t + 1), 0)
            if kind == "slow":
                time.sleep(0.002)


def main() -> None:
    # The first optimizer built in a process imports torch._dynamo (0.9 s of CPU here, more than
    # the rest of a run's start): import it once, here, rather than in every forked run. An
    # import, not a torch op: forking stays safe.
    import torch._dynamo  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the killed runs are reaped by the kernel
    for line in sys.stdin:
        cmd, out, kind, _seed = line.split()
        assert cmd == "RUN"
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the recorder waits for its writer
            try:
                train(out, kind)
            finally:
                os._exit(0)
        print(pid, flush=True)


if __name__ == "__main__":
    main()

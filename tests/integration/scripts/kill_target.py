"""A fork server of training runs for the kill -9 test: torch is imported once, each run forks.

Reads lines ``RUN OUT.h5 KIND SEED [KILL_AT]`` on stdin and answers each with the forked child's
pid. The child trains under a Recorder and, each time ``rec.step`` returns, stores the number of
completed steps in ``OUT.h5.progress`` (8 bytes, little-endian, then the time the last one returned, a
double; from byte 16 on, the time each step returned): the test's own account of what
finished, kept by the loop and not by the recorder; its warnings go to ``OUT.h5.warnings``. ``KIND`` is ``fast`` (sub-millisecond
steps), ``fast-group`` (the same in a process group of its own, for ``kill -9 -PGID``), ``slow``
(a larger batch and a few milliseconds a step) or ``big`` (a 50 MB batch, larger than the step
log). With ``KILL_AT`` the child sends itself SIGKILL right after that many steps returned. The parent never runs a torch op, so
forking it is safe.
"""

import os
import signal
import struct
import sys
import time
import warnings

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


BIG_ROWS = 1_250_000  # kind "big": a 40 MB batch (x) plus 10 MB of labels, larger than the step log


def make_batch(kind: str, t: int):
    if kind == "big":  # cheap to make at this size, and each step's own
        return torch.full((BIG_ROWS, 8), t * 1e-3), torch.full((BIG_ROWS,), t % 4)
    g = torch.Generator().manual_seed(t)
    if kind == "fast":
        return torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    return torch.randn(256, 64, generator=g), torch.randint(0, 10, (256,), generator=g)


def train(out: str, kind: str, kill_at: int) -> None:
    torch.set_num_threads(1)
    model, opt = build_slow() if kind == "slow" else build_fast()
    build = build_slow if kind == "slow" else build_fast
    progress = os.open(out + ".progress", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def keep(message, category, filename, lineno, file=None, line=None):
        with open(out + ".warnings", "a") as fh:  # what the run said, for the test to read
            fh.write(f"{category.__name__}: {message}\n")

    warnings.showwarning = keep
    with replay.Recorder(
        out,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=20,
        # the fast loop wraps the dense ring (60 steps) many times before its kill; the slow one
        # keeps the default tiers (every step back to step 0 within its run)
        reach=0 if kind == "fast" else 10_000,
    ) as rec:
        for t in range(10**9):
            rec.step(make_batch(kind, t))
            now = time.time()
            os.pwrite(progress, struct.pack("<d", now), 16 + 8 * t)  # when each step returned
            os.pwrite(progress, struct.pack("<qd", t + 1, now), 0)
            if t + 1 == kill_at:  # right after the step returned: SIGKILL, no warning
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "slow":
                time.sleep(0.002)


def main() -> None:
    # The first optimizer built in a process imports torch._dynamo (0.9 s of CPU here, more than
    # the rest of a run's start): import it once, here, rather than in every forked run. An
    # import, not a torch op: forking stays safe.
    import torch._dynamo  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the killed runs are reaped by the kernel
    for line in sys.stdin:
        cmd, out, kind, seed, *kill_at = line.split()
        assert cmd == "RUN"
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the recorder waits for its writer
            if kind == "fast-group":  # its own process group, its writer process in it too
                os.setpgid(0, 0)
                kind = "fast"
            try:
                train(out, kind, int(kill_at[0]) if kill_at else -1)
            finally:
                os._exit(0)
        print(pid, flush=True)


if __name__ == "__main__":
    main()

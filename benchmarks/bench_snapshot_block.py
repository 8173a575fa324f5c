"""How long a snapshot of a large state holds up the training thread on the CPU (issue 43 item 3).

OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_snapshot_block.py 8192

One ``nn.Linear(N, N)`` without bias and plain SGD (no optimizer state): the state is N*N float32
values (N=8192: 256 MiB; 16384 would be the issue's 1 GiB). A snapshot every 5 steps, 16 steps.
Prints each snapshot step's time, the median of the other steps, and where the training thread
spent the snapshot steps' time: the attempt to put the snapshot in the shared step log, the copy
of the state (``copy_tree``) when it does not fit there, and the wait until the writer has it in
the file (``Transport.wait_handed``: a CPU snapshot is safe before its step returns).
"""

import collections
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.getcwd())
os.environ["REPLAY_SELF_CHECK"] = "0"
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

torch.set_num_threads(1)
warnings.simplefilter("ignore")
import replay  # noqa: E402
from replay.record import step_log_writer, transport  # noqa: E402

spent: dict[str, list[float]] = collections.defaultdict(list)


def timed(owner, name, label):
    f = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[label].append(time.perf_counter() - t0)

    setattr(owner, name, wrapper)


timed(step_log_writer.StepLogWriter, "snapshot", "into the step log (tried)")
timed(transport, "copy_tree", "copy_tree (did not fit the log)")
timed(transport.Transport, "wait_handed", "wait until in the file")
N = int(sys.argv[1])


def build():
    torch.manual_seed(0)
    m = nn.Linear(N, N, bias=False)
    return m, torch.optim.SGD(m.parameters(), lr=1e-6)


def step(model, opt, batch):
    opt.zero_grad()
    loss = model(batch).square().mean()
    loss.backward()
    opt.step()
    return loss


def main():
    model, opt = build()
    batch = torch.randn(4, N)
    times = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.h5")
        with replay.Recorder(
            path, model=model, optimizer=opt, step_fn=step, build_fn=build, snapshot_every=5
        ) as rec:
            for _ in range(16):
                t0 = time.perf_counter()
                rec.step(batch)
                times.append(time.perf_counter() - t0)
    other = statistics.median(t for i, t in enumerate(times) if i % 5)
    print(f"state {N * N * 4 / 2**20:.0f} MiB; other steps {other:.3f} s (median)")
    print("snapshot steps (s): " + " ".join(f"{times[i]:.3f}" for i in (0, 5, 10, 15)))
    for label, ts in spent.items():
        print(f"  {label}: " + " ".join(f"{t:.3f}" for t in ts))


main()

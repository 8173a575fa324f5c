"""Median per-step time on the training thread, bare and under the Recorder (alternating steps), MLP workload.

OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_readback.py 200
"""

import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
os.environ["REPLAY_SELF_CHECK"] = "0"
import torch  # noqa: E402

torch.set_num_threads(1)
warnings.simplefilter("ignore")
import workloads  # noqa: E402

import replay  # noqa: E402


def build():
    torch.manual_seed(0)
    model, _ = workloads.mlp()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def main():
    steps = int(sys.argv[1])
    model, opt = build()
    bm, bo = build()
    _, batch = workloads.mlp()
    bare, rec_t = [], []
    with tempfile.TemporaryDirectory() as d:
        with replay.Recorder(
            os.path.join(d, "r.h5"),
            model=model,
            optimizer=opt,
            step_fn=workloads.step,
            build_fn=build,
        ) as rec:
            for _ in range(steps):  # bare and recorded steps alternate
                t0 = time.perf_counter()
                workloads.step(bm, bo, batch)
                bare.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                rec.step(batch)
                rec_t.append(time.perf_counter() - t0)
    b = statistics.median(bare[5:])
    r = statistics.median(rec_t[5:])
    print(f"{b * 1e6:.0f} {r * 1e6:.0f} {(r - b) * 1e6:.0f}")


main()

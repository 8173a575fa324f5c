"""The Recorder's own time per step on the training thread, MLP workload (bare and recorded steps alternate).

OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_readback.py 300

Prints three figures in us, each a median over the steps:

* ``wall: bare rec own``: a bare step and ``rec.step`` by the wall clock, and their difference;
* ``cpu: bare rec own``: the same by the training thread's CPU time (``time.thread_time``: the
  time the thread was not running, on a busy machine, is left out);
* ``own``: ``rec.step``'s CPU time less the step function's, plus the recorder's gradient probe
  that runs inside the step function (its ``GradProbe._measure``): the recorder's own time,
  without the ~4 ms of training around it whose noise dwarfs it on a shared machine.
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
from replay.capture import probe  # noqa: E402

_probe_cpu: list[float] = []  # the probe's CPU time in the step running now
_measure = probe.GradProbe._measure


def _timed_measure(self):
    c0 = time.thread_time()
    try:
        return _measure(self)
    finally:
        _probe_cpu.append(time.thread_time() - c0)


probe.GradProbe._measure = _timed_measure
_step_cpu: list[float] = []


def timed_step(model, optimizer, batch):
    c0 = time.thread_time()
    try:
        return workloads.step(model, optimizer, batch)
    finally:
        _step_cpu.append(time.thread_time() - c0)


def build():
    torch.manual_seed(0)
    model, _ = workloads.mlp()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def main():
    steps = int(sys.argv[1])
    model, opt = build()
    bm, bo = build()
    _, batch = workloads.mlp()
    bare, rec_t, bare_cpu, rec_cpu, own = [], [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        with replay.Recorder(
            os.path.join(d, "r.h5"),
            model=model,
            optimizer=opt,
            step_fn=timed_step,
            build_fn=build,
        ) as rec:
            for _ in range(steps):  # bare and recorded steps alternate
                c0, t0 = time.thread_time(), time.perf_counter()
                workloads.step(bm, bo, batch)
                bare.append(time.perf_counter() - t0)
                bare_cpu.append(time.thread_time() - c0)
                _probe_cpu.clear()
                _step_cpu.clear()
                c0, t0 = time.thread_time(), time.perf_counter()
                rec.step(batch)
                rec_t.append(time.perf_counter() - t0)
                rec_cpu.append(time.thread_time() - c0)
                own.append(rec_cpu[-1] - sum(_step_cpu) + sum(_probe_cpu))
    out = []
    for b_all, r_all in ((bare, rec_t), (bare_cpu, rec_cpu)):
        b, r = statistics.median(b_all[10:]), statistics.median(r_all[10:])
        out.append(f"{b * 1e6:.0f} {r * 1e6:.0f} {(r - b) * 1e6:.0f}")
    print(f"wall: {out[0]} | cpu: {out[1]} | own: {statistics.median(own[10:]) * 1e6:.0f}")


main()

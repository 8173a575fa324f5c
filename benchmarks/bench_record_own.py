"""What rec.step costs the training thread beyond the step function, step by step (MLP by
default): percentiles over many steps, so that a step the scheduler preempted (2 shared cores,
other jobs running) moves the tail, not the median. The gradient probe inside the step (the
optimizer's pre-hook) is the step function's time here, as in bench_record.py's handoff column.

Before against after: run it from each tree in turn, alternating, several times:

    for i in 1 2 3; do for t in OLD NEW; do (cd $t && OMP_NUM_THREADS=1 PYTHONPATH=$t \
        .venv/bin/python benchmarks/bench_record_own.py 500); done; done

Run:  .venv/bin/python benchmarks/bench_record_own.py STEPS [CNN|GPT]
"""

import os
import sys
import tempfile
import time
import warnings

sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".")
import bench_record as br  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import replay  # noqa: E402

torch.set_num_threads(1)
warnings.simplefilter("ignore")
steps = int(sys.argv[1])
name = {"CNN": "CNN", "GPT": "GPT (2 blocks)"}.get(sys.argv[2] if len(sys.argv) > 2 else "", "MLP")
br.use_workload(name)
torch.manual_seed(0)
model, opt = br.build()
inside = [0.0]


def timed(m, o, b):
    t0 = time.perf_counter()
    try:
        return br.step(m, o, b)
    finally:
        inside[0] = time.perf_counter() - t0


rec = replay.Recorder(
    os.path.join(tempfile.mkdtemp(), "h.h5"),
    model=model,
    optimizer=opt,
    step_fn=timed,
    build_fn=br.build,
    handle_signals=False,
    self_check=False,
)
br.drop_everything(rec)  # the training thread's side alone (no writer process reading)
_, template = br.WORKLOADS[name]()
batches = br.fresh_batches(template, 40)
for b in batches[:20]:
    rec.step(b)
own, fn = np.empty(steps), np.empty(steps)
for i in range(steps):
    t0 = time.perf_counter()
    rec.step(batches[i % 40])
    own[i], fn[i] = time.perf_counter() - t0 - inside[0], inside[0]
p10, p25, p50 = np.percentile(own, [10, 25, 50]) * 1e6
print(
    f"{os.path.basename(os.getcwd())} {name}: training thread beyond the step, per step: "
    f"p10 {p10:.0f} p25 {p25:.0f} p50 {p50:.0f} us (step function p50 {np.median(fn) * 1e3:.2f} ms)"
)
rec.close()

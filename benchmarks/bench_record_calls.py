"""Python and C calls the recorder makes per rec.step (MLP), the step function's own calls
left out (the gradient probe inside it counted): what load on the machine cannot blur.

Run:  .venv/bin/python benchmarks/bench_record_calls.py TREE STEPS [v]   (v: the calls by function)
"""

import collections
import os
import sys
import tempfile

root = sys.argv[1]
steps = int(sys.argv[2])
sys.path.insert(0, os.path.join(root, "benchmarks"))
sys.path.insert(0, root)
import warnings  # noqa: E402

import bench_record as br  # noqa: E402
import torch  # noqa: E402

import replay  # noqa: E402

torch.set_num_threads(1)
warnings.simplefilter("ignore")

name = "MLP"
tmp = tempfile.mkdtemp()
br.use_workload(name)
torch.manual_seed(0)
model, opt = br.build()
inside = [False]


def st(m, o, b):
    inside[0] = True
    try:
        return br.step(m, o, b)
    finally:
        inside[0] = False


rec = replay.Recorder(
    os.path.join(tmp, "h.h5"),
    model=model,
    optimizer=opt,
    step_fn=st,
    build_fn=br.build,
    handle_signals=False,
    self_check=False,
)
br.drop_everything(rec)
_, template = br.WORKLOADS[name]()
batches = br.fresh_batches(template, 40)
for b in batches[:12]:
    rec.step(b)
cnt = collections.Counter()
where = collections.Counter()


def prof(frame, event, arg):
    if (
        inside[0]
        and "probe" not in frame.f_code.co_filename
        and "fingerprint" not in frame.f_code.co_filename
    ):
        return
    if event in ("call", "c_call"):
        cnt[event] += 1
        if event == "call":
            where[f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"] += 1


for i in range(steps):
    b = batches[(12 + i) % 40]
    sys.setprofile(prof)
    rec.step(b)
    sys.setprofile(None)
rec.close()
print(
    f"{root}: per step: {cnt['call'] / steps:.1f} Python calls, {cnt['c_call'] / steps:.1f} C calls"
)
if len(sys.argv) > 3:
    for k, v in where.most_common(80):
        print(f"  {v / steps:5.1f} {k}")

"""Where the recorder's gradient norm goes on a CPU run: on the training thread, in the
optimizer's step pre-hook (what ``capture/probe.py`` does), or on a second thread while the
optimizer steps (tried in issue 45 and reverted: this is why).

The MLP's Adam step four ways, interleaved step by step (each its own copy of the model, the
order rotating), one torch thread so that a core is free for the second thread:

- ``bare``: the optimizer's step alone;
- ``norm here``: the norm (``GradMeter``'s three ops) on the training thread, then the step;
- ``norm beside``: the norm's ``_foreach_norm`` handed to a waiting thread, the step, a wait for
  the thread, the norm's last two ops here;
- ``wake only``: a job that does nothing handed to that thread, the step, the wait.

Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_norm_placement.py [STEPS]
"""

import functools
import queue
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, "benchmarks")
from workloads import mlp  # noqa: E402

torch.set_num_threads(1)
jobs: queue.SimpleQueue = queue.SimpleQueue()


def work():
    while True:
        fn, done, out = jobs.get()
        out.append(fn())
        done.set()


def beside(fn):
    done, out = threading.Event(), []
    jobs.put((fn, done, out))
    return done, out


def norm(parts):
    return torch.linalg.vector_norm(torch.stack(parts), dtype=torch.float64)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    threading.Thread(target=work, daemon=True).start()
    kinds = ["bare", "norm here", "norm beside", "wake only"]
    runs = {}
    for k in kinds:
        torch.manual_seed(0)
        model, (x, y) = mlp()
        runs[k] = (model, x, y, torch.optim.Adam(model.parameters(), lr=1e-3))
    took = {k: [] for k in kinds}
    for i in range(steps):
        for k in kinds[i % 4 :] + kinds[: i % 4]:
            model, x, y, opt = runs[k]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            grads = [p.grad for p in model.parameters()]
            t0 = time.perf_counter()
            if k == "norm here":
                norm(torch._foreach_norm(grads))
                opt.step()
            elif k == "norm beside":
                done, out = beside(functools.partial(torch._foreach_norm, grads))
                opt.step()
                done.wait()
                norm(out[0])
            elif k == "wake only":
                done, _ = beside(lambda: None)
                opt.step()
                done.wait()
            else:
                opt.step()
            took[k].append(time.perf_counter() - t0)
    print("| optimizer step, MLP Adam | p25 (us) | p50 (us) | mean (us) |\n|---|---|---|---|")
    for k in kinds:
        a = np.array(took[k][steps // 10 :]) * 1e6
        print(f"| {k} | {np.percentile(a, 25):.0f} | {np.median(a):.0f} | {a.mean():.0f} |")


if __name__ == "__main__":
    main()

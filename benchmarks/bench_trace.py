"""Cost of a traced step: trace_step vs the plain step vs torch.autograd.detect_anomaly.

Side by side in one process, alternating variants, median of the repetitions; three CPU
workloads (an MLP, a small CNN, a small GPT). Prints a markdown table.

Run:  PYTHONPATH=. .venv/bin/python benchmarks/bench_trace.py [--reps 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from workloads import cnn, gpt, mlp, step  # noqa: E402  (benchmarks/ is on sys.path)

from replay.trace import trace_step


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(name, make, reps):
    torch.manual_seed(0)
    model, batch = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def plain():
        step(model, opt, batch)

    def anomaly():
        with torch.autograd.detect_anomaly(check_nan=True):
            step(model, opt, batch)

    def traced():
        trace_step(model, opt, step, batch)

    variants = {"plain": plain, "detect_anomaly": anomaly, "trace_step": traced}
    for fn in variants.values():  # warm up
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for k, fn in variants.items():
            times[k].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    n_ops = trace_step(model, opt, step, batch).n_ops
    return name, med, n_ops


def main() -> None:
    import warnings

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args()
    warnings.simplefilter("ignore")  # detect_anomaly warns on every use
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"median of {args.reps} alternating repetitions\n"
    )
    print("| workload | aten ops | plain step | detect_anomaly | trace_step | trace / plain |")
    print("|---|---|---|---|---|---|")
    for name, make in (("MLP", mlp), ("CNN", cnn), ("GPT (2 blocks)", gpt)):
        name, med, n_ops = bench(name, make, args.reps)
        p_ = med["plain"]
        print(
            f"| {name} | {n_ops} | {p_ * 1e3:.1f} ms | {med['detect_anomaly'] / p_:.2f}x | "
            f"{med['trace_step'] * 1e3:.1f} ms | {med['trace_step'] / p_:.2f}x |"
        )


if __name__ == "__main__":
    main()

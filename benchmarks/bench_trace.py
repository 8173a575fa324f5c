"""Cost of a traced step: trace_step vs the plain step vs torch.autograd.detect_anomaly.

Side by side in one process, alternating variants, median of the repetitions; three CPU
workloads (an MLP, a small CNN, a small GPT), and a many-small-ops one (issue 33): an LSTMCell
sequence model unrolled in Python under LBFGS, twenty closure calls per step. Prints a markdown
table, and for the many-small-ops workload where the traced step's time goes (the tracer's own
share, measured by tracing with the per-op work switched off, then with statistics off) and the
tracer's peak memory (tracemalloc's peak over one traced step).

Run:  PYTHONPATH=. .venv/bin/python benchmarks/bench_trace.py [--reps 15] [--only lstm]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from workloads import cnn, gpt, lbfgs_step, lstm_lbfgs, mlp, step  # noqa: E402

from replay.trace import trace_step


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(name, make, reps):
    torch.manual_seed(0)
    model, batch = make()
    lbfgs = make is lstm_lbfgs
    if lbfgs:
        opt = torch.optim.LBFGS(
            model.parameters(), lr=0.8, max_iter=20, tolerance_grad=0.0, tolerance_change=0.0
        )  # fmt: skip  (always 20 closure calls)
        run = lbfgs_step
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        run = step

    def plain():
        run(model, opt, batch)

    def anomaly():
        with torch.autograd.detect_anomaly(check_nan=True):
            run(model, opt, batch)

    def traced():
        trace_step(model, opt, run, batch)

    variants = {"plain": plain, "detect_anomaly": anomaly, "trace_step": traced}
    for fn in variants.values():  # warm up
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for k, fn in variants.items():
            times[k].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    n_ops = trace_step(model, opt, run, batch).n_ops
    if lbfgs:
        med.update(breakdown(model, opt, run, batch))
    return name, med, n_ops


def breakdown(model, opt, run, batch) -> dict[str, float]:
    """Where a traced step's time goes: the modes and hooks alone (every op passed straight
    through), the per-op bookkeeping without statistics, the whole tracer; and its peak memory."""
    import tracemalloc

    import numpy as np

    import replay.trace.mode as mode
    from replay.trace.mode import Tracer
    from replay.trace.stats import NO_STATS

    out = {}
    on_op, stats = Tracer.on_op, mode.tensor_stats
    try:
        Tracer.on_op = lambda self, f, a, k: f(*a, **k)
        out["modes_only"] = timed(lambda: trace_step(model, opt, run, batch))
        Tracer.on_op = on_op
        finite = NO_STATS._replace(nan=0.0, posinf=0.0, neginf=0.0)
        mode.tensor_stats = lambda t, hist=True: (finite, np.zeros(16, np.float32))
        out["no_stats"] = timed(lambda: trace_step(model, opt, run, batch))
    finally:
        Tracer.on_op, mode.tensor_stats = on_op, stats
    tracemalloc.start()
    trace_step(model, opt, run, batch)
    out["peak_bytes"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out


def main() -> None:
    import warnings

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--only", choices=["standard", "lstm"], default=None)
    args = p.parse_args()
    warnings.simplefilter("ignore")  # detect_anomaly warns on every use
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"median of {args.reps} alternating repetitions\n"
    )
    print("| workload | aten ops | plain step | detect_anomaly | trace_step | trace / plain |")
    print("|---|---|---|---|---|---|")
    loads = [("MLP", mlp), ("CNN", cnn), ("GPT (2 blocks)", gpt)]
    loads = [] if args.only == "lstm" else loads
    if args.only != "standard":
        loads.append(("LSTMCell x LBFGS (20 closure calls)", lstm_lbfgs))
    split = []
    for name, make in loads:
        name, med, n_ops = bench(name, make, args.reps)
        if "modes_only" in med:
            split.append((name, med, n_ops))
        p_ = med["plain"]
        print(
            f"| {name} | {n_ops} | {p_ * 1e3:.1f} ms | {med['detect_anomaly'] / p_:.2f}x | "
            f"{med['trace_step'] * 1e3:.1f} ms | {med['trace_step'] / p_:.2f}x |"
        )

    for name, med, n_ops in split:
        p_, t_ = med["plain"], med["trace_step"]
        print(
            f"\n{name}: where the traced step's {t_:.2f} s go ({n_ops} ops, one run each):\n\n"
            "| part | seconds | per op |\n|---|---|---|\n"
            f"| the step itself (plain) | {p_:.2f} | {p_ / n_ops * 1e6:.1f} us |\n"
            f"| + dispatch and function modes, hooks (ops passed through) | "
            f"{med['modes_only'] - p_:.2f} | {(med['modes_only'] - p_) / n_ops * 1e6:.1f} us |\n"
            f"| + per-op bookkeeping (attribution, origins, memory, the spooled row) | "
            f"{med['no_stats'] - med['modes_only']:.2f} | "
            f"{(med['no_stats'] - med['modes_only']) / n_ops * 1e6:.1f} us |\n"
            f"| + statistics and histogram of each output | {t_ - med['no_stats']:.2f} | "
            f"{(t_ - med['no_stats']) / n_ops * 1e6:.1f} us |\n"
            f"\npeak Python memory of one traced step (tracemalloc): "
            f"{med['peak_bytes'] / 2**20:.1f} MiB"
        )


if __name__ == "__main__":
    main()

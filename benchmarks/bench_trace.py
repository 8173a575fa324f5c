"""Cost of a traced step: trace_step vs the plain step vs torch.autograd.detect_anomaly.

Side by side in one process, alternating variants, median of the repetitions; three CPU
workloads (an MLP, a small CNN, a small GPT), and a many-small-ops one (issue 33): an LSTMCell
sequence model unrolled in Python under LBFGS, twenty closure calls per step. Prints a markdown
table, and for the many-small-ops workload where the traced step's time goes (the tracer's own
share, measured by tracing with the per-op work switched off, then with statistics off) and the
tracer's peak memory (tracemalloc's peak over one traced step).

Run:  PYTHONPATH=.:benchmarks OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_trace.py \
          [--reps 15] [--lstm-reps 3] [--only standard|lstm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from workloads import cnn, gpt, lbfgs_step, lstm_lbfgs, mlp, step  # noqa: E402

from replay.trace import trace_step


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(name, make, reps, memory=False):
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

    def traced():  # as `replay trace` and `bisect` run it (workflows/culprit.py)
        trace_step(model, opt, run, batch, direct_dispatch=True)

    def wrapped():  # through dynamo's wrapper around the dispatch mode, as a compiled step is
        trace_step(model, opt, run, batch)

    variants = {
        "plain": plain,
        "detect_anomaly": anomaly,
        "trace_step": traced,
        "wrapped": wrapped,
    }
    if lbfgs:  # the parts of the traced step, in the same alternation
        variants.update(parts(model, opt, run, batch))
    for k in ("plain", "trace_step"):  # warm up (each variant runs the same code)
        variants[k]()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for k, fn in variants.items():
            times[k].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    n_ops = trace_step(model, opt, run, batch, direct_dispatch=True).n_ops
    if lbfgs and memory:
        med["peak_bytes"] = peak_bytes(model, opt, run, batch)
    return name, med, n_ops


def parts(model, opt, run, batch):
    """Where a traced step's time goes, as variants of it: the modes and hooks alone (every
    op passed straight through), and the per-op bookkeeping without statistics (no copy, no
    finiteness check, a constant row). The whole tracer is ``trace_step``."""
    import replay.trace.oplog as mode
    from replay.trace.mode import Tracer

    finite = mode.NO_STATS._replace(nan=0.0, posinf=0.0, neginf=0.0)

    def modes_only():
        on_op = Tracer.on_op
        Tracer.on_op = lambda self, f, a, k: f(*a, **k)
        try:
            trace_step(model, opt, run, batch, direct_dispatch=True)
        finally:
            Tracer.on_op = on_op

    def no_stats():
        copy_small, stats = mode.copy_small, mode.tensor_stats
        mode.copy_small = lambda t: None
        mode.tensor_stats = lambda t, hist=True: (finite, mode.NO_HIST)
        try:
            trace_step(model, opt, run, batch, direct_dispatch=True)
        finally:
            mode.copy_small, mode.tensor_stats = copy_small, stats

    return {"modes_only": modes_only, "no_stats": no_stats}


def peak_bytes(model, opt, run, batch) -> int:
    """tracemalloc's peak over one traced step."""
    import tracemalloc

    tracemalloc.start()
    trace_step(model, opt, run, batch, direct_dispatch=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> None:
    import warnings

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--lstm-reps", type=int, default=3, help="repetitions for the LSTM workload")
    p.add_argument("--only", choices=["standard", "lstm"], default=None)
    p.add_argument(
        "--memory", action="store_true", help="also the LSTM trace's peak (tracemalloc: slow)"
    )
    args = p.parse_args()
    warnings.simplefilter("ignore")  # detect_anomaly warns on every use
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of "
        f"{args.reps} alternating repetitions ({args.lstm_reps} for the LSTM workload); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the start\n"
    )
    print(
        "| workload | aten ops | plain step | detect_anomaly | trace_step | trace / plain "
        "| wrapped mode / plain |"
    )
    print("|---|---|---|---|---|---|---|")
    loads = [("MLP", mlp), ("CNN", cnn), ("GPT (2 blocks)", gpt)]
    loads = [] if args.only == "lstm" else loads
    if args.only != "standard":
        loads.append(("LSTMCell x LBFGS (20 closure calls)", lstm_lbfgs))
    split = []
    for name, make in loads:
        reps = args.lstm_reps if make is lstm_lbfgs else args.reps
        name, med, n_ops = bench(name, make, reps, args.memory)
        if "modes_only" in med:
            split.append((name, med, n_ops))
        p_ = med["plain"]
        print(
            f"| {name} | {n_ops} | {p_ * 1e3:.1f} ms | {med['detect_anomaly'] / p_:.2f}x | "
            f"{med['trace_step'] * 1e3:.1f} ms | {med['trace_step'] / p_:.2f}x | "
            f"{med['wrapped'] / p_:.2f}x |"
        )

    for name, med, n_ops in split:
        p_, t_ = med["plain"], med["trace_step"]
        print(
            f"\n{name}: where the traced step's {t_:.2f} s go ({n_ops} ops; medians of the "
            "same alternation):\n\n"
            "| part | seconds | per op |\n|---|---|---|\n"
            f"| the step itself (plain) | {p_:.2f} | {p_ / n_ops * 1e6:.1f} us |\n"
            f"| + dispatch and function modes, hooks (ops passed through) | "
            f"{med['modes_only'] - p_:.2f} | {(med['modes_only'] - p_) / n_ops * 1e6:.1f} us |\n"
            f"| + per-op bookkeeping (attribution, memory, shapes, the spooled row) | "
            f"{med['no_stats'] - med['modes_only']:.2f} | "
            f"{(med['no_stats'] - med['modes_only']) / n_ops * 1e6:.1f} us |\n"
            f"| + finiteness check, statistics and histogram of each output | "
            f"{t_ - med['no_stats']:.2f} | "
            f"{(t_ - med['no_stats']) / n_ops * 1e6:.1f} us |\n"
        )
        if "peak_bytes" in med:
            print(
                f"\npeak Python memory of one traced step (tracemalloc): "
                f"{med['peak_bytes'] / 2**20:.1f} MiB"
            )


if __name__ == "__main__":
    main()

"""Recorder overhead: step time with replay.Recorder (default settings) vs bare training.

Side by side in one process, alternating variants round by round, on the three workloads
(benchmarks/workloads.py). Beside the recorder, the peers a user would otherwise reach for:
``torch.autograd.detect_anomaly``, forward/backward NaN hooks on every module, and ``torch.save``
of model + optimizer every step. Each variant trains its own copy of the model on a stream of
fresh batches (so the recorder copies a new batch every step, as in real training). The ratio of
each round is variant / bare for that round; the table shows the median over rounds.

The recorder is measured twice. "recorder" times the training loop alone: its steps are handed
to the writer, which may still be busy with them when the block ends (the backlog is committed
after the clock stops, so it never runs into the next variant's block). "recorder, committed"
(a second recorder) stops the clock only once every step of the block is in the file, less the
time of an empty flush (the latency of one round trip to the writer): the cost of recording when
the writer has to keep up, as in a long run on saturated cores, where the backlog would
otherwise grow until training waits for it (``max_pending_steps``/``max_pending_seconds``).

"recorder, no self-check" is the same Recorder made with ``self_check=False``: the background
self-check (a child replaying the first steps, started after the first ones) shares the machine
with training while it runs; the two columns side by side give its share separately.

Two more columns say how far the recorder's figures can be trusted and where its cost lies.
"bare, again" trains a second bare copy exactly like the first: its ratio is the benchmark's own
noise (the copies' memory lands in different places). "training thread only" is a recorder whose
writer drops every job (an ablation, only here): what capturing a step costs the training thread
(RNG states, the batch copy, the gradient norm in the optimizer's pre-hook, the health row) when
nothing is ever encoded or written. ``--threads 1`` leaves a core to the writer, as a GPU run or
a CPU run with spare cores would.

Also measures the store's write throughput (payload bytes committed per second by the writer
process) next to the disk's raw sequential write speed with fdatasync.

Run:  .venv/bin/python benchmarks/bench_record.py [--rounds 15 --steps 40] [--threads N]
          [--variants recorder,committed,...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workloads import WORKLOADS, step  # noqa: E402

import replay  # noqa: E402

WORKLOAD_ENV = "REPLAY_BENCH_WORKLOAD"


def use_workload(name: str) -> None:
    """The workload ``build`` rebuilds, in this process and in the recorder's self-check child
    (was a module dict: the child's ``build()`` raised KeyError and every benchmarked recording
    warned it does NOT replay)."""
    os.environ[WORKLOAD_ENV] = name


def build():
    """Module-level build_fn, as the Recorder requires (rebuilds the current workload)."""
    model, _ = WORKLOADS[os.environ[WORKLOAD_ENV]]()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def recorder_for(path, model, optimizer, **settings):
    """The Recorder every benchmark measures: default settings, the shared step and build."""
    return replay.Recorder(
        path,
        model=model,
        optimizer=optimizer,
        step_fn=step,
        build_fn=build,
        handle_signals=False,
        **settings,
    )


class DroppingWriter:
    """In place of the recorder's background writer: every job is dropped on arrival (its pooled
    buffers go straight back), so only the training thread's side of recording is timed."""

    error = None
    throttled = 0  # what the recorder reads of a writer, beside error

    def __init__(self, pool):
        self._pool = pool

    def submit(self, job):
        if getattr(job, "buffers", None):
            self._pool.give(job.buffers)

    def flush(self, timeout=None):
        return True

    def close(self, timeout=None, ended=None):
        pass


def drop_everything(rec):
    """Make ``rec`` a "training thread only" recorder: its writer thread drops every job, and
    its step log lets the training thread write over each record once it is published (the
    writer process never opens the file, so it never reads the log)."""
    rec.transport.writer = DroppingWriter(
        rec.transport.pool
    )  # the recorder then never starts its own
    if rec.transport.log is not None:
        log = rec.transport.log.log
        publish = log.publish

        def publish_and_drop(health):
            publish(health)
            log.release(log.head)

        log.publish = publish_and_drop


_INSIDE: list[float] = []  # seconds spent in the step function, by timed_step


def timed_step(model, optimizer, batch):
    """The workload's step, timed from the inside: what the recorder adds is the rest."""
    t0 = time.perf_counter()
    out = step(model, optimizer, batch)
    _INSIDE.append(time.perf_counter() - t0)
    return out


def handoff(name, steps, tmp):
    """The training thread's own cost per recorded step, in microseconds: ``rec.step`` less the
    step function, with nothing written (``drop_everything``). Beside it, a plain copy of the
    batch's bytes into a buffer allocated once, timed right after a training step too (the
    caches as cold as the recorder finds them)."""
    use_workload(name)
    torch.manual_seed(0)
    model, opt = build()
    rec = replay.Recorder(
        os.path.join(tmp, f"{name[:3]}-handoff.h5"),
        model=model,
        optimizer=opt,
        step_fn=timed_step,
        build_fn=build,
        handle_signals=False,
    )
    drop_everything(rec)
    _, template = WORKLOADS[name]()
    batches = fresh_batches(template, steps)
    torch.manual_seed(0)
    bare_model, bare_opt = build()
    nbytes = sum(t.numel() * t.element_size() for t in batches[0])
    buf = np.empty(nbytes, dtype=np.uint8)
    own, copy = [], []
    for b in batches[:3]:
        rec.step(b)
    for b in batches * 3:
        _INSIDE.clear()
        t0 = time.perf_counter()
        rec.step(b)
        own.append(time.perf_counter() - t0 - _INSIDE[0])
        step(bare_model, bare_opt, b)
        t0 = time.perf_counter()
        pos = 0
        for t in b:
            a = t.numpy().reshape(-1).view(np.uint8)
            np.copyto(buf[pos : pos + a.size], a)
            pos += a.size
        copy.append(time.perf_counter() - t0)
    rec.close()
    return nbytes, statistics.median(own) * 1e6, statistics.median(copy) * 1e6


COLUMNS = {  # variant -> table header, in table order
    "bare_again": "bare, again",
    "thread_only": "training thread only",
    "recorder": "recorder",
    "no_self_check": "recorder, no self-check",
    "committed": "recorder, committed",
    "detect_anomaly": "detect_anomaly",
    "nan_hooks": "NaN hooks (every module)",
    "torch_save": "torch.save every step",
}
BOLD = {"committed"}


def fresh_batches(template, n):
    """n distinct batches shaped like the template (floats jittered, integers permuted)."""
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        batch = []
        for t in template:
            if t.is_floating_point():
                batch.append(t + 0.01 * torch.randn(t.shape, generator=g))
            else:
                batch.append(t[torch.randperm(t.shape[0], generator=g)])
        out.append(tuple(batch))
    return out


class NanHooks:
    """Forward and backward hooks on every module that check outputs for NaN/Inf."""

    def __init__(self, model):
        self.handles = []
        for m in model.modules():
            self.handles.append(m.register_forward_hook(self._fwd))
            self.handles.append(m.register_full_backward_hook(self._bwd))

    @staticmethod
    def _check(ts):
        for t in ts:
            if (
                isinstance(t, torch.Tensor)
                and t.is_floating_point()
                and not torch.isfinite(t).all()
            ):
                raise FloatingPointError("non-finite")

    def _fwd(self, m, inp, out):
        self._check(out if isinstance(out, tuple) else (out,))

    def _bwd(self, m, gin, gout):
        self._check(gin)


def make_variants(name, tmp, wanted):
    use_workload(name)
    states = {}
    for v in ("bare", *wanted):
        torch.manual_seed(0)
        states[v] = build()
    recs = {
        v: recorder_for(
            os.path.join(tmp, f"{name[:3]}-{v}.h5"),
            *states[v],
            **({"self_check": False} if v == "no_self_check" else {}),
        )
        for v in ("recorder", "no_self_check", "committed", "thread_only")
        if v in wanted
    }
    if "thread_only" in recs:
        drop_everything(recs["thread_only"])
    if "nan_hooks" in wanted:
        NanHooks(states["nan_hooks"][0])
    save_path = os.path.join(tmp, "ckpt.pt")

    def plain(v):
        return lambda b: step(*states[v], b)

    def recorded(v):
        return recs[v].step

    def anomaly(b):
        with torch.autograd.detect_anomaly(check_nan=True):
            step(*states["detect_anomaly"], b)

    def save(b):
        m, o = states["torch_save"]
        step(m, o, b)
        torch.save({"model": m.state_dict(), "optimizer": o.state_dict()}, save_path)

    makers = {
        "bare": plain,
        "bare_again": plain,
        "nan_hooks": plain,
        "recorder": recorded,
        "no_self_check": recorded,
        "committed": recorded,
        "thread_only": recorded,
        "detect_anomaly": lambda v: anomaly,
        "torch_save": lambda v: save,
    }
    return {v: makers[v](v) for v in ("bare", *wanted)}, recs


def bench(name, rounds, steps, tmp, wanted):
    variants, recs = make_variants(name, tmp, wanted)
    _, template = WORKLOADS[name]()
    batches = fresh_batches(template, steps)
    for fn in variants.values():  # warm up (and let the recorder's first step create the file)
        for b in batches[:3]:
            fn(b)
    per_round = {k: [] for k in variants}
    order = list(variants)
    for _ in range(rounds):
        order = order[1:] + order[:1]  # rotate so no variant always runs first
        for k in order:
            fn = variants[k]
            t0 = time.perf_counter()
            for b in batches:
                fn(b)
            if k == "committed":
                recs[k].flush()
                elapsed = time.perf_counter() - t0
                # A flush has a fixed latency (the writer process gathers frames for 20 ms after
                # a wake-up): an empty one, timed right after, takes it back out.
                t1 = time.perf_counter()
                recs[k].flush()
                elapsed -= time.perf_counter() - t1
            else:
                elapsed = time.perf_counter() - t0
            per_round[k].append(elapsed / steps)
            if k in ("recorder", "no_self_check"):
                recs[k].flush()  # its backlog, off the clock
    for rec in recs.values():
        rec.close()
    bare = np.array(per_round["bare"])
    ratios = {k: statistics.median(np.array(v) / bare) for k, v in per_round.items()}
    return statistics.median(per_round["bare"]), ratios


def disk_speed(tmp, mb=256):
    buf = os.urandom(1 << 20)
    path = os.path.join(tmp, "raw.bin")
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(mb):
            fh.write(buf)
        fh.flush()
        os.fdatasync(fh.fileno())
    dt = time.perf_counter() - t0
    os.unlink(path)
    return mb / dt


def store_speed(tmp, mb=256):
    """Payload throughput of the writer process: large batches, committed one per step."""
    from replay.store.contracts import HealthFrame, StepFrame
    from replay.store.layout import HEALTH_COLUMNS
    from replay.store.writer import RingSpec
    from replay.store.writer_process import WriterClient

    payload = np.frombuffer(os.urandom(4 << 20), dtype=np.uint8)
    client = WriterClient().create(
        os.path.join(tmp, "tp.h5"),
        run_id="bench",
        meta={},
        sources={},
        steps=RingSpec(16, 1 << 20, payload.size),
        snapshots=RingSpec(2, 1 << 20, 1 << 20),
        health_slots=64,
    )
    n = mb // 4
    row = np.zeros(len(HEALTH_COLUMNS))
    t0 = time.perf_counter()
    for i in range(n):
        client.commit(steps=[StepFrame(i, payload, 0)], health=[HealthFrame(i, row)], last_step=i)
    dt = time.perf_counter() - t0
    client.close()
    return n * 4 / dt


def main() -> None:
    import warnings

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads first")
    p.add_argument(
        "--variants",
        default=",".join(COLUMNS),
        help=f"comma-separated, beside bare: {','.join(COLUMNS)}",
    )
    p.add_argument("--no-throughput", action="store_true", help="skip the store/disk speeds")
    p.add_argument(
        "--no-handoff", action="store_true", help="skip the training thread's cost in us"
    )
    args = p.parse_args()
    wanted = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(wanted) - set(COLUMNS))
    if unknown:
        p.error(f"unknown variants: {', '.join(unknown)} (choose from {', '.join(COLUMNS)})")
    wanted = [v for v in COLUMNS if v in wanted]
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # detect_anomaly warns on every use
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores; "
        f"{args.rounds} alternating rounds of {args.steps} steps per variant; "
        "ratio = median over rounds of (variant / bare) step time\n"
    )
    print("| workload | bare step | " + " | ".join(COLUMNS[v] for v in wanted) + " |")
    print("|---|---|" + "---|" * len(wanted))
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for name in WORKLOADS:
            bare, r = bench(name, args.rounds, args.steps, tmp, wanted)
            cells = [f"**{r[v]:.3f}x**" if v in BOLD else f"{r[v]:.3f}x" for v in wanted]
            print(f"| {name} | {bare * 1e3:.2f} ms | " + " | ".join(cells) + " |", flush=True)
        if not args.no_handoff:
            print()
            print(
                "| workload | batch | training thread, per step | memcpy of the batch | goal "
                "(2x memcpy + 50 us) |"
            )
            print("|---|---|---|---|---|")
            for name in WORKLOADS:
                nbytes, own, copy = handoff(name, args.steps, tmp)
                print(
                    f"| {name} | {nbytes / 1024:.0f} KiB | {own:.0f} us | {copy:.1f} us | "
                    f"{2 * copy + 50:.0f} us |",
                    flush=True,
                )
        if not args.no_throughput:
            print()
            print(
                f"store write throughput (writer process, 4 MiB steps): {store_speed(tmp):.0f} "
                f"MB/s; disk raw sequential write with fdatasync: {disk_speed(tmp):.0f} MB/s"
            )


if __name__ == "__main__":
    main()

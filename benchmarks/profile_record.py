"""Where a recorded step's time goes on the training thread, by part: a sampled profile.

``bench_record.py`` gives the ratio (recorder against bare, side by side); this says which part
of ``rec.step`` the difference is. py-spy samples the training loop below (MLP by default,
self-check off, the writer process on) without slowing C code; the samples under
``Recorder.step`` are then split into the step function (and the gradient probe inside it, the
optimizer's pre-hook) and the recorder's own parts, each as a share of the step function less
the probe (a bare step). The sampler slows Python more than C, so the shares are upper bounds;
the unsampled ratio is ``bench_record.py``'s.

    pip install py-spy
    OMP_NUM_THREADS=1 py-spy record --rate 500 --format raw -o /tmp/raw.txt -- \\
        .venv/bin/python benchmarks/profile_record.py loop 30 [MLP|CNN|GPT]
    .venv/bin/python benchmarks/profile_record.py parts /tmp/raw.txt

Without py-spy, ``profile_record.py sample 30 [MLP|CNN|GPT]`` samples the loop from a thread of
its own (``sys._current_frames``, every 2 ms; it takes the GIL to look, so it slows the loop
more, and sees a C call as the Python line that made it) and prints the same table.
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import time
import warnings

LOOP = "loop (profile_record.py:"  # the frame of the loop's own rec.step call (see ``loop``)

# (part, the frames that make it): the first that matches a sample, in this order
PARTS = (
    ("gradient probe (in the step)", ("GradProbe._pre_step", "GradProbe.end")),
    ("snapshot copy", ("Snapshots.take",)),
    ("record into the step log", ("StepLog.begin",)),
    ("encoding the record", ("PackCache.pack",)),
    ("batch leaves", ("host_leaves",)),
    ("rng states", ("capture_rng",)),
    ("hyper-parameters", ("HyperParams.take",)),
    ("publishing steps", ("StepCapture.pass_on",)),
    ("health row", ("StepCapture._health", "StepCapture.finish")),
    ("before the step, other", ("StepCapture.begin",)),
    ("writer check", ("Recorder._ready",)),
)


def loop(seconds: float, workload: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, ".")
    import bench_record as br
    import torch

    import replay

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    name = {"CNN": "CNN", "GPT": "GPT (2 blocks)"}.get(workload, "MLP")
    br.use_workload(name)
    torch.manual_seed(0)
    model, opt = br.build()
    rec = replay.Recorder(
        os.path.join(tempfile.mkdtemp(), "p.h5"),
        model=model,
        optimizer=opt,
        step_fn=br.step,
        build_fn=br.build,
        handle_signals=False,
        self_check=False,
    )
    batches = br.fresh_batches(br.WORKLOADS[name]()[1], 40)
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        rec.step(batches[i % 40])
        i += 1
    rec.close()
    print(f"{name}: {i} recorded steps in {seconds:g} s")


def sample(seconds: float, workload: str) -> str:
    """``loop`` on this thread, sampled from another: py-spy's raw format, one line a stack."""
    import threading

    main, stacks = threading.get_ident(), collections.Counter[str]()
    done = threading.Event()

    def sampler() -> None:
        while not done.wait(0.002):
            frame, names = sys._current_frames().get(main), []
            while frame is not None:
                code = frame.f_code
                names.append(
                    f"{getattr(code, 'co_qualname', code.co_name)} ({os.path.basename(code.co_filename)}:0)"
                )
                frame = frame.f_back
            stacks[";".join(reversed(names))] += 1

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        loop(seconds, workload)
    finally:
        done.set()
        thread.join()
    return "\n".join(f"{stack} {n}" for stack, n in stacks.items())


def parts(raw: str) -> dict[str, int]:
    """Samples per part of py-spy's ``--format raw`` lines (``frame;frame;... count``) taken
    under the loop's ``rec.step``; ``step function`` is the bare step's."""
    out: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        names = [f.split(" (")[0] for f in stack.split(";")]
        at = [i for i in range(1, len(names)) if names[i] == "Recorder.step" and LOOP in stack]
        if not at or names[at[0] - 1] != "loop":
            continue
        names = names[at[0] + 1 :]
        part = next((p for p, fns in PARTS if any(f in fns for f in names)), None)
        if part is None:
            part = "step function" if "StepCall.__call__" in names else "Recorder.step, other"
        out[part] += int(n)
    return dict(out)


def report(counts: dict[str, int]) -> str:
    bare = counts.get("step function", 0)
    lines = [f"samples in the step function (less the probe): {bare}", ""]
    lines += ["| part | samples | share of a bare step |", "|---|---|---|"]
    own = 0
    for part, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if part != "step function":
            own += n
            lines.append(f"| {part} | {n} | {100 * n / max(bare, 1):.1f}% |")
    lines.append(f"| all of the recorder | {own} | {100 * own / max(bare, 1):.1f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["loop"]:
        loop(float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "MLP")
    elif sys.argv[1:2] == ["sample"]:
        raw = sample(float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "MLP")
        print(report(parts(raw)))
    elif sys.argv[1:2] == ["parts"]:
        with open(sys.argv[2]) as f:
            print(report(parts(f.read())))
    else:
        sys.exit(__doc__)

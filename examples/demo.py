"""What `make demo` runs: record a small GPT whose learning rate is too high, then find the NaN.

1. runs examples/gpt_diverging_lr.py in a subprocess: it trains until the loss turns NaN and
   leaves its recording in runs/gpt_diverging_lr.h5;
2. runs `replay bisect` on it (the first bad step, the op, the module, the source line);
3. runs `replay doctor` on it (what the loss and gradient curves say, and what to do);
4. says how to look at it all in the TUI.

Run:
    python examples/demo.py            (or: make demo)

Verdict: demo
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join("runs", "gpt_diverging_lr.h5")


def replay(*args: str) -> int:
    """Run the replay CLI with this interpreter, output straight to the terminal."""
    print(f"\n$ replay {' '.join(args)}", flush=True)
    return subprocess.call([sys.executable, "-m", "replay", *args])


def main() -> int:
    os.makedirs("runs", exist_ok=True)
    for stale in (RUN, RUN.replace(".h5", ".forensics.h5")):
        if os.path.exists(stale):
            os.remove(stale)
    print(f"$ python examples/gpt_diverging_lr.py {RUN}", flush=True)
    # One torch thread: the same numbers, so the same verdict, on a machine of any size (the
    # recording keeps the thread count, and replay runs with it).
    one = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.check_call([sys.executable, os.path.join(HERE, "gpt_diverging_lr.py"), RUN], env=one)
    rc = replay("bisect", RUN)
    if rc not in (0, 1):
        print(f"replay bisect failed (exit {rc})")
        return rc
    replay("doctor", RUN)
    print(f"\nExplore it: replay tui {RUN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

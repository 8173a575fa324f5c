"""First paint and op-to-op latency of `replay tui` on a synthetic 200,000-op trace.

    PYTHONPATH=. python benchmarks/bench_tui.py [--ops 200000] [--repeat 3]

Makes a tiny real recording (tests/tui/train_fixture.py, needs torch), writes a synthetic
sidecar of N ops for it with ``write_forensics``, then, in this process, times ``make_app`` to
the first paint of the op list with its rows read (no ``…`` left) and the mean time of a
``down`` key press (move, detail read, repaint) beside the same key on an empty Textual app
under the same pilot (the harness's own cost). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "tui"))


async def _measure(path: str, moves: int) -> tuple[float, float]:
    from helpers import workers_done

    from replay_tui import make_app

    t0 = time.perf_counter()
    app = make_app(path, poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        while True:
            found = app.screen.query("OpList")
            if found and found.first().loaded and found.first().size.height:
                break
            await asyncio.sleep(0.002)
        first_paint = time.perf_counter() - t0
        await workers_done(app)  # (a cancelled exclusive worker is normal)
        t1 = time.perf_counter()
        for _ in range(moves):
            await pilot.press("down")
            await pilot.pause()
        per_move = (time.perf_counter() - t1) / moves
    return first_paint, per_move


async def _baseline(moves: int) -> float:
    """Per-key time of an empty Textual app under the same pilot: the harness's own cost."""
    from textual.app import App
    from textual.widgets import Static

    class Empty(App[None]):
        def compose(self):  # noqa: ANN202
            yield Static("x")

    async with Empty().run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        t = time.perf_counter()
        for _ in range(moves):
            await pilot.press("down")
            await pilot.pause()
        return (time.perf_counter() - t) / moves


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--moves", type=int, default=50)
    args = ap.parse_args()
    from synthetic import write_synthetic

    from replay.store import open_recording

    work = tempfile.mkdtemp(prefix="bench-tui-")
    try:
        shutil.copy(os.path.join(ROOT, "tests", "tui", "train_fixture.py"), work)
        env = dict(os.environ, PYTHONPATH=ROOT)
        subprocess.run(
            [sys.executable, "train_fixture.py", work],
            cwd=work,
            env=env,
            check=True,
            capture_output=True,
        )
        run = os.path.join(work, "run.h5")
        with open_recording(run) as rec:
            run_id = rec.run_id
        t = time.perf_counter()
        write_synthetic(os.path.join(work, "run.forensics.h5"), run_id, args.ops)
        write_s = time.perf_counter() - t
        size = os.path.getsize(os.path.join(work, "run.forensics.h5"))
        rows = []
        for _ in range(args.repeat):  # alternate the variants
            rows.append(
                (*asyncio.run(_measure(run, args.moves)), asyncio.run(_baseline(args.moves)))
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"synthetic sidecar: {args.ops:,} ops, {size / 2**20:.0f} MiB, written in {write_s:.2f} s\n"
    )
    print(
        "| run | first paint of the op list (s) | per `down` key (ms) | same key, empty app (ms) |"
    )
    print("|---|---|---|---|")
    for i, (fp, mv, base) in enumerate(rows, 1):
        print(f"| {i} | {fp:.3f} | {mv * 1000:.1f} | {base * 1000:.1f} |")


if __name__ == "__main__":
    main()

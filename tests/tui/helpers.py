"""Pilot helpers: wait until the app has nothing left to do."""

from __future__ import annotations

from typing import Any

from textual.worker import WorkerCancelled


async def workers_done(app: Any) -> None:
    """Wait for every worker; one cancelled because a newer exclusive worker replaced it is
    normal (``wait_for_complete`` raises for it: benchmarks/bench_tui.py failed 1 run in 2)."""
    for worker in list(app.workers):
        try:
            await worker.wait()
        except WorkerCancelled:
            pass


async def settle(pilot: Any) -> None:
    """Let workers finish and the screen repaint (twice: a worker's result can start another)."""
    for _ in range(3):
        await pilot.pause()
        await workers_done(pilot.app)
    await pilot.pause()


async def press(pilot: Any, *keys: str) -> None:
    for k in keys:
        await pilot.press(k)
        await settle(pilot)

"""Pilot helpers: wait until the app has nothing left to do."""

from __future__ import annotations

from typing import Any


async def settle(pilot: Any) -> None:
    """Let workers finish and the screen repaint (twice: a worker's result can start another)."""
    for _ in range(3):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def press(pilot: Any, *keys: str) -> None:
    for k in keys:
        await pilot.press(k)
        await settle(pilot)

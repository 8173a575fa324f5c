"""The TUI and the page show the same facts: a number on one is the number on the other
(both read the recording and the sidecar through the same readers and reports, and write
numbers with ``replay.words.fmt_num``)."""

from __future__ import annotations

import re

from textual.widgets import DataTable

from replay.report import build_page
from replay_tui import make_app


async def _settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()
        for w in list(pilot.app.workers):
            await w.wait()
    await pilot.pause()


async def test_the_loss_and_a_gradient_norm_read_the_same_in_the_tui_and_the_page(example):
    html = build_page(example.traced)
    page_loss = re.search(r'data-key="loss">([^<]+)</span>', html).group(1)
    name = "0.weight"
    page_grad = re.search(
        rf'<tr><td>{re.escape(name)}</td><td class="num" data-v="[^"]*">([^<]+)</td>', html
    ).group(1)
    app = make_app(example.traced, poll=False)
    async with app.run_test(size=(140, 45)) as pilot:
        await _settle(pilot)
        await pilot.press("1")  # the overview: its cursor starts on the traced step
        await _settle(pilot)
        info = str(app.screen.query_one("#cursor-info").render())
        assert f"step {example.bisect['first_bad_step']}" in info
        tui_loss = re.search(r"loss\s+(\S+)", info).group(1)
        await pilot.press("4")  # gradients
        await _settle(pilot)
        row = app.screen.query_one("#grad-table", DataTable).get_row(name)
        tui_grad = str(getattr(row[2], "plain", row[2]))
    assert tui_loss == page_loss
    assert tui_grad == page_grad

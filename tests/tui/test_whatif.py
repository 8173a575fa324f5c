"""The what-if form on the overview (``w``): a change typed in, ``replay whatif`` run on it in a
child process, its loss plotted beside the recorded one."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from helpers import press, settle
from textual.widgets import Input, Static

from replay_tui import make_app
from replay_tui.screens.whatif import WhatIfForm, parse_change
from replay_tui.widgets.plot import SeriesPlot


def test_a_change_is_read_with_or_without_its_dashes_and_checked():
    assert parse_change("scale lr=0.1") == ["--scale", "lr=0.1"]
    assert parse_change("--drop-samples 6:3,5") == ["--drop-samples", "6:3,5"]
    assert parse_change("no-autocast") == ["--no-autocast"]
    for bad, why in (
        ("", "type a change"),
        ("lr=0.1", "not a change"),
        ("--seed", "one value"),
        ("no-autocast 1", "no value"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_change(bad)


async def _submit(pilot, app, text):
    await press(pilot, "w")
    assert isinstance(app.screen, WhatIfForm)
    app.screen.query_one(Input).value = text
    await press(pilot, "enter")


async def test_w_runs_a_what_if_and_plots_it_beside_the_recording(runs, tmp_path):
    """Step 6 of the fixture fails on its all-zero samples 3 and 5: dropping both removes the
    failure, and the plots show the recorded loss (NaN at 6) beside the finite one."""
    run = tmp_path / "run.h5"
    shutil.copy(runs["plain"], run)
    app = make_app(str(run), poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.view == "overview"
        overview = app.get_screen("overview")
        assert not overview.query_one("#whatif-panel").display
        # refused in the form: nothing runs (what was typed is text: "[/]" was a MarkupError
        # that ended the TUI)
        await _submit(pilot, app, "[/]bogus 1")
        assert isinstance(app.screen, WhatIfForm)
        said = str(app.screen.query_one("#whatif-error", Static).render())
        assert "'[/]bogus' is not a change" in said
        await press(pilot, "escape")
        assert app.screen is overview
        await _submit(pilot, app, "drop-samples 6:3,5")
        await settle(pilot)
        assert overview.query_one("#whatif-panel").display
        verdict = str(overview.query_one("#whatif-verdict", Static).render())
        assert "--drop-samples 6:3,5 removes the failure" in verdict
        recorded = overview.query_one("#whatif-recorded", SeriesPlot).values
        changed = overview.query_one("#whatif-changed", SeriesPlot).values
        assert len(recorded) == len(changed) > 1
        assert not np.isfinite(recorded[-1]) and np.isfinite(changed).all()
        await _submit(pilot, app, "drop-samples 6:3")  # sample 5 still divides 0 by 0
        await settle(pilot)
        verdict = str(overview.query_one("#whatif-verdict", Static).render())
        assert "still fails at step 6" in verdict

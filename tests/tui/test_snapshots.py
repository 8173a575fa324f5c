"""SVG snapshots of every view on the fixture recording (fixed size, nothing time-dependent on
screen). Update after an intended change: pytest tests/tui/test_snapshots.py --snapshot-update"""

from __future__ import annotations

import pytest
from helpers import settle

from replay_tui import make_app

SIZE = (120, 40)


def _snap(snap_compare, path, keys=(), size=SIZE):
    async def ready(pilot):
        await settle(pilot)
        for k in keys:
            await pilot.press(k)
            await settle(pilot)

    return snap_compare(make_app(path, poll=False), run_before=ready, terminal_size=size)


def test_ops_view(runs, snap_compare):
    """Ops opens on the culprit: op 4 `div` of body.0.norm marked ● and selected, propagators
    ○ after it, the detail pane ("● culprit", "the producer: made NaN from finite inputs", the
    words `replay bisect` uses) with output stats (16 NaN), histogram and the source line
    `return x / x.norm(...)`; status bar "culprit #4 aten::div"."""
    assert _snap(snap_compare, runs["traced"])


def test_ops_view_small_terminal(runs, snap_compare):
    """At 80x24 the op list sits above the detail pane; the culprit row is visible."""
    assert _snap(snap_compare, runs["traced"], size=(80, 24))


def test_ops_view_filtered(runs, snap_compare):
    """After `p p`: only backward ops (bw), status bar says "filter phase:backward"."""
    assert _snap(snap_compare, runs["traced"], keys=("p", "p"))


def test_overview(runs, snap_compare):
    """Overview: loss, gradient norm, learning rate plots with × at the NaN step 6, marks S at
    snapshots 0 and 4, ▲ symptom and ◆ first bad at 6; side panel: step 6 health (loss nan),
    run facts, entry points train_step/build in train_fixture.py, the forensics verdict (its
    cause "op: aten::div made NaN from finite inputs" and "culprit: aten::div in body.0.norm")."""
    assert _snap(snap_compare, runs["traced"], keys=("1",))


def test_overview_without_forensics(runs, snap_compare):
    """A recording without a sidecar opens on the overview and says to run `replay bisect`."""
    assert _snap(snap_compare, runs["plain"])


def test_ops_without_forensics(runs, snap_compare):
    """The ops view of a recording without forensics: a notice naming `replay bisect run.h5`."""
    assert _snap(snap_compare, runs["plain"], keys=("2",))


def test_layers(runs, snap_compare):
    """Layers: module tree unfolded down to body.0.norm (highlighted, 16 NaN/Inf), its
    activation statistics per module."""
    assert _snap(snap_compare, runs["traced"], keys=("3",))


def test_gradients(runs, snap_compare):
    """Gradients: five parameters with NaN counts and the NaN/Inf warning sign each."""
    assert _snap(snap_compare, runs["traced"], keys=("4",))


def test_memory(runs, snap_compare):
    """Memory: the curve over the step's ops, peak marked ┴, peak size and op, the largest
    tensors alive there."""
    assert _snap(snap_compare, runs["traced"], keys=("5",))


def test_source(runs, snap_compare):
    """Source: the culprit's stack (innermost `forward train_fixture.py:24` selected) and the
    code around line 24 with ▶ on `return x / x.norm(dim=1, keepdim=True)`."""
    assert _snap(snap_compare, runs["traced"], keys=("6",))


def test_batch(runs, snap_compare):
    """Batch of step 6: tensors x (8, 8) and y (8,), per-sample rows where samples 3 and 5
    are all zeros (mean 0, |max| 0)."""
    assert _snap(snap_compare, runs["traced"], keys=("7",))


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_help(runs, snap_compare, size):
    """Help lists every key, grouped by view, readable at 80x24 and 200x60."""
    assert _snap(snap_compare, runs["traced"], keys=("question_mark",), size=size)

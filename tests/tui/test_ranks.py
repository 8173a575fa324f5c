"""The Ranks view (key 8) on a real 2-rank recording: every rank side by side, the culprit flagged."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from helpers import press, settle
from test_snapshots import _snap

from replay_tui import make_app
from replay_tui.widgets.rank_table import RankTable
from tests.conftest import RANK_NAN_STEP, run_env
from tests.unit.test_rank_sets import record_rank


async def test_rank_set_opens_the_culprit_and_lists_every_rank(rank_set):
    app = make_app(rank_set, poll=False)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        # the other views show the rank that went bad, as `replay bisect run.h5` would replay it
        assert os.path.basename(app.model.path) == "run.rank1.h5"
        await press(pilot, "8")
        assert app.view == "ranks"
        s = app.model.ranks
        assert [r.rank for r in s.rows] == [0, 1]
        assert s.culprit_ranks == (1,) and s.culprit_step == RANK_NAN_STEP
        rows = {r.rank: r for r in s.rows}
        assert rows[0].own_bad is None and rows[0].steps_total == 20
        assert rows[1].own_bad == (RANK_NAN_STEP, ("loss",))
        assert rows[1].steps_total == RANK_NAN_STEP + 1
        head = str(app.screen.query_one("#ranks-head").render())
        assert f"culprit rank 1: first bad at step {RANK_NAN_STEP} on rank 1 (loss)" in head
        table = app.screen.query_one(RankTable).render().plain
        lines = table.splitlines()
        rank1 = next(line for line in lines if line.startswith("▶"))
        assert rank1.split()[1:5] == ["1", str(RANK_NAN_STEP + 1), "nan", "step"]
        assert f"step {RANK_NAN_STEP} (loss)" in rank1 and "×" in rank1
        rank0 = next(line for line in lines if line.split()[:2] == ["0", "20"])
        assert "×" not in rank0 and "step 12" not in rank0


async def test_a_glob_and_the_folder_name_the_same_rank_set(rank_set):
    folder = os.path.dirname(rank_set)
    for spec in (folder, os.path.join(folder, "run.rank*.h5")):
        app = make_app(spec, poll=False)
        async with app.run_test(size=(120, 30)) as pilot:
            await settle(pilot)
            assert os.path.basename(app.model.path) == "run.rank1.h5"
            assert app.model.ranks is not None and app.model.ranks.culprit_ranks == (1,)


async def test_a_single_recording_is_not_a_distributed_run(runs):
    app = make_app(runs["plain"], poll=False)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await press(pilot, "8")
        assert app.view == "ranks" and app.model.ranks is None
        assert "not a distributed run" in str(app.screen.query_one("#ranks-head").render())
        assert not app.screen.query_one(RankTable).display


def test_ranks_view(rank_set, snap_compare):
    """Ranks at 120x40: "rank set run.h5 · 2 rank files, world size 2", the red line "culprit
    rank 1: first bad at step 12 on rank 1 (loss)", "views 1-7 show rank 1 (run.rank1.h5)"; a
    row per rank: rank 0 with 20 steps, last loss 1.4, no own failure and its sparkline over
    steps 0..19; rank 1 marked ▶ in bold red with 13 steps, last loss nan, "step 12 (loss)",
    its sparkline ending in a red × at step 12 (both lines identical up to there); the shared
    loss scale and the step 0 / step 19 axis."""
    assert _snap(snap_compare, rank_set, keys=("8",))


def test_a_folder_without_rank_files_is_one_line_exit_3(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "replay", "tui", str(tmp_path)],
        capture_output=True,
        text=True,
        env=run_env(),
        timeout=60,
    )
    assert r.returncode == 3 and "without rank recordings" in r.stderr
    assert r.stderr.strip().count("\n") == 0


async def test_every_ranks_trace_is_listed(rank_set, tmp_path):
    """After ``replay bisect`` on a rank set each rank has its own sidecar: the view lists what
    each one's trace names (the culprit's op; a rank whose NaN arrived through the all-reduce)."""
    import shutil

    from synthetic import synthetic_tables

    from replay.store import open_recording
    from replay.store.forensics import write_forensics

    folder = tmp_path / "ddp"
    folder.mkdir()
    for r in (0, 1):
        src = rank_set.replace("run.h5", f"run.rank{r}.h5")
        shutil.copy(src, folder / f"run.rank{r}.h5")
        with open_recording(str(folder / f"run.rank{r}.h5")) as rec:
            run_id, sidecar = rec.run_id, rec.forensics_path
        tables = synthetic_tables(50, 10)
        if r == 0:
            tables["verdict"].update(op=None, op_index=None, phase=None, module=None)
        write_forensics(sidecar, run_id=run_id, step=RANK_NAN_STEP, tables=tables)
    app = make_app(str(folder / "run.h5"), poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await press(pilot, "8")
        head = str(app.screen.query_one("#ranks-head").render())
        assert "per-op traces (replay bisect, every rank):" in head
        assert f"rank 1  step {RANK_NAN_STEP}: aten::log (forward) in enc.layers.0.mlp" in head
        assert f"rank 0  step {RANK_NAN_STEP}: no op of its own made it" in head


async def test_a_rank_that_died_outside_a_step_is_the_culprit_in_the_ranks_view(tmp_path):
    """Rank 1's loop raised between steps 3 and 4 (its ``with`` block kept the ending); rank 0
    recorded on. Was: no rank was flagged (no step of rank 1 went bad), its row said "-"."""
    import replay
    from tests.unit.test_rank_sets import build, train_step

    record_rank(str(tmp_path / "run.rank0.h5"), 0, 2, steps=5)
    model, opt = build()
    try:
        with replay.Recorder(
            str(tmp_path / "run.rank1.h5"), model=model, optimizer=opt, step_fn=train_step,
            build_fn=build, snapshot_every=2, rank=1, world_size=2,
        ) as rec:  # fmt: skip
            for s in range(5):
                if s == 4:
                    # (a message is the program's own text: a terminal title sequence here)
                    raise OSError("image file is truncated (sample 17)\x1b]0;owned\x07")
                rec.step(torch.full((3, 4), float(s + 1)))
    except OSError:
        pass
    app = make_app(str(tmp_path / "run.h5"), poll=False)
    async with app.run_test(size=(160, 30)) as pilot:
        await settle(pilot)
        assert os.path.basename(app.model.path) == "run.rank1.h5"
        await press(pilot, "8")
        head = str(app.screen.query_one("#ranks-head").render())
        assert "culprit rank 1: rank 1 died: OSError: image file is truncated (sample 17)" in head
        assert "\x1b" not in head and "\x07" not in head, repr(head)
        table = app.screen.query_one(RankTable).render().plain
        rank1 = next(line for line in table.splitlines() if line.startswith("▶"))
        assert "died after step 3" in rank1, table

"""Every optimizer's hyper-parameters per step (issue 44, item 6): a run with two optimizers
(an encoder's Adam and a decoder's SGD named ``optD``), two param groups each, and schedules
the loop steps outside the step function. Each step's values, per optimizer and group, come
back from the recording exactly as the step saw them, show in ``replay info`` and in
``replay export``'s ``hparams.json``, and a replay puts the second optimizer's back too."""

from __future__ import annotations

import json

import pytest

from replay.store import open_recording
from replay.store.hparams import step_hparams
from tests.conftest import SCRIPTS, replay_cli, replay_json, run_py

STEPS = 12


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    d = tmp_path_factory.mktemp("hparams")
    p = run_py(str(SCRIPTS / "two_optimizers.py"), "run.h5", "--steps", str(STEPS), cwd=d)
    assert p.returncode == 0, p.stderr[-2000:]
    return d, json.loads(p.stdout)


def test_every_optimizers_hyper_parameters_round_trip_at_every_step(recorded):
    d, seen = recorded
    with open_recording(str(d / "run.h5")) as rec:
        got = {str(t): step_hparams(rec, t) for t in range(STEPS)}
    assert got == seen
    # the schedules did move: each group of each optimizer, and a momentum set by hand
    lrs = {(o, i) for t in seen.values() for o, gs in t.items() for i, g in enumerate(gs)}
    assert len(lrs) == 4
    assert seen["11"]["optD"][0]["momentum"] != seen["0"]["optD"][0]["momentum"]
    assert seen["11"]["optimizer"][1]["lr"] != seen["0"]["optimizer"][1]["lr"]


def test_info_shows_each_optimizers_groups(recorded):
    d, seen = recorded
    code, info, err = replay_json("info", "run.h5", cwd=d)
    assert code == 0, err
    assert info["hparams"] == {"step": STEPS - 1, "optimizers": seen[str(STEPS - 1)]}
    text = replay_cli("info", "run.h5", cwd=d).stdout
    assert f"optD group 1 at step {STEPS - 1}: lr 0.0025, momentum 0.5" in text
    assert "schedD group" not in text  # a scheduler's optimizer is the one already named


def test_export_writes_the_schedule_from_the_exported_step_on(recorded):
    d, seen = recorded
    p = replay_cli("export", "run.h5", "--out", "back", "--step", "0", "--trust", cwd=d)
    assert p.returncode == 0, p.stderr[-2000:]
    schedule = json.loads((d / "back" / "hparams.json").read_text())["steps"]
    assert schedule == {str(t): seen[str(t)] for t in range(STEPS)}


def test_a_second_optimizers_schedule_outside_the_step_replays_bitwise(recorded):
    """Before, only the run's optimizer's groups were recorded: the decoder's lr stayed at its
    snapshot's and verify found steps 4..11 differ ("outside_state")."""
    d, _ = recorded
    code, v, err = replay_json("verify", "run.h5", "--trust", cwd=d)
    assert code == 0 and v["deterministic"] is True, (v, err[-2000:])


async def test_the_tuis_overview_shows_every_groups_lr_at_the_cursor(recorded):
    from replay_tui import make_app

    d, seen = recorded
    app = make_app(str(d / "run.h5"), poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(4):
            await pilot.pause()
        overview = app.get_screen("overview")
        step = int(app.model.health["step"][overview.cursor])
        info = str(overview.query_one("#cursor-info").render())
    for name, groups in seen[str(step)].items():
        for i in range(len(groups)):
            assert f"lr {name}[{i}]" in info
    assert f"{seen[str(step)]['optD'][1]['lr']:.4g}" in info

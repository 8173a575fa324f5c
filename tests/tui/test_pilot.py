"""Pilot tests: open real recordings, press keys, check what the app holds."""

from __future__ import annotations

import numpy as np
from helpers import press, settle, workers_done

from replay.store.forensics import ForensicsReader
from replay_tui import make_app
from replay_tui.widgets.notice import NoForensics
from replay_tui.widgets.op_list import OpList


def _ops(app):
    return app.get_screen("ops")


async def test_opens_on_the_culprit_and_jumps_between_nonfinite_ops(runs):
    with ForensicsReader.open(runs["traced"].replace(".h5", ".forensics.h5")) as f:
        culprit = f.verdict["op_index"]
        status = f.ops_columns(0, f.n_ops, ("status",))["status"]
    bad = np.flatnonzero(np.isin(status, (1, 2, 3)))
    app = make_app(runs["traced"], poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.view == "ops"
        ops = _ops(app)
        assert ops.selected == culprit
        await press(pilot, "n")
        assert ops.selected == bad[bad > culprit][0]
        await press(pilot, "n", "N")
        assert ops.selected == bad[bad > culprit][0]
        await press(pilot, "down", "down")
        assert ops.selected == bad[bad > culprit][0] + 2
        await press(pilot, "c")
        assert ops.selected == culprit
        assert "div" in str(ops.query_one("#op-detail").render())


async def test_filters_by_phase_name_and_module(runs):
    app = make_app(runs["traced"], poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        ops = _ops(app)
        reader = app.model.forensics
        full = reader.ops_columns(0, reader.n_ops, ("phase", "name", "module"))
        names = reader.strings("ops")
        await press(pilot, "p")  # forward only
        rows = ops.op_list.rows
        assert len(rows) and (full["phase"][rows] == 0).all()
        await press(pilot, "p")  # backward only
        assert (full["phase"][ops.op_list.rows] == 1).all()
        await press(pilot, "x", "slash")
        await pilot.press(*"op:div")
        await press(pilot, "enter")
        rows = ops.op_list.rows
        assert len(rows) >= 2 and all("div" in names[full["name"][r]] for r in rows)
        assert ops.filter.describe() == "op:div"
        await press(pilot, "x")
        assert len(ops.op_list.rows) == reader.n_ops
        # next op of the same module as the culprit (body.0.norm)
        await press(pilot, "c", "m")
        mods = reader.strings("modules")
        assert mods[full["module"][ops.selected]] == "body.0.norm"
        assert ops.selected > reader.verdict.op_index


async def test_layers_show_culprit_module_and_filter_ops(runs):
    app = make_app(runs["traced"], poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await press(pilot, "3")
        assert app.view == "layers"
        tree = app.screen.query_one("#module-tree")
        assert tree.cursor_node.data == "body.0.norm"
        await press(pilot, "o")
        assert app.view == "ops"
        ops = _ops(app)
        assert ops.filter.module == "body.0.norm"
        mods = app.model.forensics.strings("modules")
        cols = app.model.forensics.ops_columns(0, app.model.forensics.n_ops, ("module",))
        assert {mods[cols["module"][r]] for r in ops.op_list.rows} == {"body.0.norm"}


async def test_every_view_opens_and_help_lists_keys(runs):
    app = make_app(runs["traced"], poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        for key, view in zip(
            "1234567", ("overview", "ops", "layers", "gradients", "memory", "source", "batch")
        ):
            await press(pilot, key)
            assert app.view == view
        await press(pilot, "question_mark")
        assert app.view == "help"
        text = str(app.screen.query_one("#help-keys").render())
        for must in ("next NaN", "culprit", "filter", "sort by", "frame up", "prev step", "quit"):
            assert must in text
        await press(pilot, "escape")
        assert app.view == "batch"
        await press(pilot, "q")
    assert app.return_code == 0


async def test_gradients_sort_and_warning_signs(runs):
    app = make_app(runs["traced"], poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await press(pilot, "4")
        screen = app.screen
        assert screen.sort_key == "warnings"
        await press(pilot, "s")
        assert screen.sort_key == SORT_NEXT
        table = screen.query_one("#grad-table")
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert names == sorted(names, reverse=True)
        await press(pilot, "r")
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert names == sorted(names)
        # every parameter got NaN gradients at the traced step
        signs = [str(table.get_row_at(i)[6]) for i in range(table.row_count)]
        assert all("NaN/Inf" in s for s in signs)


SORT_NEXT = "name"


async def test_source_moves_through_frames(runs):
    app = make_app(runs["traced"], poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await press(pilot, "6")
        screen = app.screen
        assert screen.frame == len(screen.frames) - 1
        code = str(screen.query_one("#code").render())
        assert "x / x.norm(dim=1, keepdim=True)" in code
        await press(pilot, "u")
        assert screen.frame == len(screen.frames) - 2
        assert "def forward" in str(screen.query_one("#code").render())


async def test_batch_shows_failing_step_and_moves(runs):
    app = make_app(runs["traced"], poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await press(pilot, "7")
        screen = app.screen
        assert screen.step == 6
        assert [lf.path for lf in screen.leaves] == ["x", "y"]
        x = screen.leaves[0]
        assert x.absmax[3] == 0 and x.absmax[5] == 0 and x.absmax[0] > 0
        await press(pilot, "left_square_bracket")
        assert screen.step == 5


async def test_overview_cursor_starts_on_first_bad_step(runs):
    app = make_app(runs["plain"], poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.view == "overview"
        screen = app.screen
        steps = app.model.health["step"]
        assert steps[screen.cursor] == 6
        await press(pilot, "left")
        assert steps[screen.cursor] == 5
        await press(pilot, "f")
        assert steps[screen.cursor] == 6


async def test_without_forensics_views_say_how_to_get_them(runs):
    app = make_app(runs["plain"], poll=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        for key in "2345":
            await press(pilot, key)
            notice = app.screen.query_one(NoForensics)
            assert "replay bisect run.h5" in str(notice.render())
        await press(pilot, "7")
        assert app.screen.step == 6


async def test_sidecar_appearing_later_is_picked_up(runs, tmp_path):
    import shutil

    shutil.copy(runs["plain"], tmp_path / "run.h5")
    app = make_app(tmp_path / "run.h5")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await press(pilot, "2")
        assert app.screen.query(NoForensics)
        shutil.copy(runs["traced"].replace(".h5", ".forensics.h5"), tmp_path / "run.forensics.h5")
        for _ in range(40):  # the poll runs every 2 s
            await pilot.pause(0.1)
            if app.model.forensics is not None:
                break
        await settle(pilot)
        assert app.model.forensics is not None
        assert app.screen.query(OpList)


async def test_200k_ops_open_and_navigate(runs):
    app = make_app(runs["big"], poll=False)
    culprit = int(runs["big_culprit"])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        ops = _ops(app)
        assert ops.op_list.n_ops == 200_000
        assert ops.selected == culprit and ops.op_list.loaded
        await press(pilot, "G")
        assert ops.selected == 199_999 and ops.op_list.loaded
        await press(pilot, "c", "n")
        assert ops.selected == culprit + 1
        await press(pilot, "p", "p")  # backward ops only
        assert (ops.full["phase"][ops.op_list.rows] == 1).all()


async def test_detail_and_status_word_the_culprit_as_the_bisect_report_does(runs):
    """Verdict and TUI agree: the op detail, the status line and ``replay bisect``'s report use
    the words of ``replay.words`` for the same op."""
    from replay.cli.render import render_verdict
    from replay.reports import BisectReport, TraceVerdict
    from replay.words import op_role, role_text

    with ForensicsReader.open(runs["traced"].replace(".h5", ".forensics.h5")) as f:
        d = f.verdict
        v = TraceVerdict.from_json(d)
        culprit = v.op_index
        row = f.op_row(culprit)
        nxt = int(np.flatnonzero(f.ops_columns(0, f.n_ops, ("status",))["status"] == 2)[0])
        nxt_row = f.op_row(nxt)
    word, why = op_role(v, culprit, row["status"])
    assert (word, v.cause) == ("culprit", "op") and why.startswith("the producer")
    report = render_verdict(
        BisectReport.from_json(
            {
                **d,
                "healthy": False,
                "window": [0, 6],
                "first_bad_step": v.step,
                "symptom_step": v.step,
                "criterion": "NaN/Inf",
                "reproducible": True,
                "deterministic": True,
                "replayed_steps": 1,
                "rechecked_steps": 1,
                "snapshot": 4,
                "device": "cpu",
            }
        )
    )
    assert f"[{word}]" in report and why.removeprefix("the producer: ") in report
    app = make_app(runs["traced"], poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        ops = _ops(app)
        detail = str(ops.query_one("#op-detail").render())
        assert f"● {word}" in detail and why in detail
        assert f"{word} #{culprit} {v.op}" in str(ops.query_one("#ops-status").render())
        ops.select_op(nxt)
        await settle(pilot)
        await pilot.pause(0.2)
        detail = str(ops.query_one("#op-detail").render())
        assert role_text(v, nxt, nxt_row["status"]).split(" · ")[0] in detail
        assert "propagator" in detail


def test_batch_view_words_samples_along_other_axes_as_the_report_does():
    """Samples along dim 1, or [micro-batch, row] pairs, are not rows of the batch view: it
    names them in its title with the report's words instead of marking rows."""
    from types import SimpleNamespace

    from replay.cli.render import render_verdict
    from replay.reports import BisectReport, TraceVerdict
    from replay_tui.model import RunModel

    m = RunModel.__new__(RunModel)
    base = {
        "healthy": False,
        "window": [0, 9],
        "first_bad_step": 7,
        "symptom_step": 7,
        "kind": "nonfinite",
        "criterion": "NaN/Inf",
        "reproducible": True,
        "deterministic": True,
        "replayed_steps": 3,
        "rechecked_steps": 1,
        "snapshot": 5,
        "device": "cpu",
    }
    for samples, axes in (([7], [1]), ([[2, 5]], [0, 1])):
        v = {**base, "samples": samples, "sample_axes": axes}
        m.forensics = SimpleNamespace(verdict=TraceVerdict.from_json(v))
        assert m.culprit_samples() == ("rows", [])  # (a verdict that names no layout)
        text = m.culprit_samples_elsewhere()
        assert text and f"samples       {text}" in render_verdict(BisectReport.from_json(v))
    m.forensics = SimpleNamespace(
        verdict=TraceVerdict.from_json({**base, "samples": [3], "sample_axes": [0]})
    )
    assert m.culprit_samples() == ("rows", [3]) and m.culprit_samples_elsewhere() is None


async def test_t_on_the_overview_traces_the_step_under_the_cursor(runs, tmp_path):
    """A healthy run has no forensics until a step is traced; the overview can do it (through
    `replay trace` in a child process) and the op views fill in."""
    import shutil

    run = tmp_path / "run.h5"
    shutil.copy(runs["plain"], run)
    app = make_app(str(run), poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.view == "overview" and app.model.forensics is None
        await press(pilot, "home", "right", "right")
        screen = app.get_screen("overview")
        want = int(app.model.health["step"][screen.cursor])
        await press(pilot, "t")
        await settle(pilot)
        assert app.model.forensics is not None
        assert app.model.forensics.step == want and app.model.forensics.n_ops > 0


async def test_the_overview_says_how_the_program_ended_outside_any_step(runs, tmp_path):
    import shutil

    import h5py
    import numpy as np

    from replay.record.ending import ending
    from replay.store.writer import json_blob

    shutil.copy(runs["plain"], tmp_path / "run.h5")
    try:
        raise ValueError("corrupt sample 7")
    except ValueError as e:
        text = json_blob(ending(e, 9))
    with h5py.File(tmp_path / "run.h5", "r+") as f:  # (what the recorder's close writes)
        f["ended"][: text.size] = np.asarray(text)
    app = make_app(tmp_path / "run.h5", poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        info = str(app.screen.query_one("#run-info").render())
        assert "ended by ValueError: corrupt sample 7, outside any step, after step 9" in info


async def test_a_path_in_a_crafted_recording_is_shown_as_text_never_as_markup(runs, tmp_path):
    """Pressing ``t`` named the entry points' files from the recording in a notification that
    Textual reads as markup: a file that names one ``[/]`` ended the TUI with a MarkupError,
    and ``[@click=...]`` made an action link."""
    import json
    import shutil

    import h5py
    import numpy as np

    shutil.copy(runs["plain"], tmp_path / "run.h5")
    with h5py.File(tmp_path / "run.h5", "r+") as f:  # (as a stranger with h5py would)
        meta = json.loads(f["meta/run"][()].tobytes().decode())
        meta["entry"]["step_fn"]["path"] = "/tmp/[/]x[@click=app.quit]y"
        del f["meta/run"]
        f["meta"].create_dataset("run", data=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    app = make_app(tmp_path / "run.h5", poll=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await press(pilot, "t")
        await workers_done(app)
        await settle(pilot)
        from textual.content import Content

        # (as the toast draws it: markup is parsed unless the notification says not to)
        shown = [
            n.message if not n.markup else Content.from_markup(n.message).plain
            for n in app._notifications
        ]
        assert len(shown) == 2 and all("/tmp/[/]x[@click=app.quit]y" in m for m in shown), shown

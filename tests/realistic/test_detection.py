"""Object detection shaped like torchvision's references/detection
(programs/detection_lists.py): a batch is a tuple of images of their own sizes and a tuple of
target dicts (``collate_fn``'s ``tuple(zip(*batch))``); a box without width makes the box
coder's ``log(gt_width / anchor_width)`` -inf."""

from __future__ import annotations

import asyncio

from tests.realistic.test_real_programs import bisect_json, record, replay
from tests.realistic.test_upstream_classes import digests


def test_a_degenerate_box_is_blamed_on_its_image_not_on_a_channel(tmp_path, elsewhere):
    """Was: the batch was cut along dim 0 of every tensor, the images' channels (3, the
    commonest leading size), and bisect named "sample 2", exactly, where the box without width
    was sample 3's (image 13 of the dataset)."""
    run, p = record(tmp_path, "detection_lists.py", "--degenerate", "13")
    assert p.returncode == 1 and "loss is inf at step 4" in p.stderr, p.stderr[-2000:]
    before = digests(tmp_path)

    d = bisect_json(run, elsewhere)
    assert (d["first_bad_step"], d["reproducible"], d["deterministic"]) == (4, True, True), d
    assert (d["cause"], d["op"], d["phase"], d["made"]) == ("op", "aten::log", "forward", "-inf")
    assert d["source"]["code"].endswith("# encode width"), d["source"]
    assert d["sample_axes"] == [0] and d["samples"] == [3] and d["samples_exact"], d

    # images of their own sizes: the doctor's input check concatenated them across steps and
    # crashed (an internal error from `replay doctor` and `replay report`)
    doc = replay("doctor", str(run), "--json", cwd=elsewhere)
    assert doc.returncode in (0, 1) and "nonfinite_recorded" in doc.stdout, doc.stderr[-2000:]

    after = digests(tmp_path)
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == {"run.forensics.h5"}

    # replay tui's batch view marks the culprit sample's own image and targets, not row 3 of
    # whatever tensor is highlighted (there was none: the rows were channels and boxes)
    asyncio.run(_batch_view_marks(str(run)))


async def _batch_view_marks(run: str) -> None:
    from replay_tui import make_app
    from replay_tui.screens.batch import BatchScreen

    app = make_app(run, poll=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("7")
        for _ in range(100):
            await pilot.pause(0.05)
            if isinstance(app.screen, BatchScreen) and app.screen.leaves:
                break
        table = app.screen.query_one("#leaves")
        marked = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        marked = [m.removesuffix("  culprit") for m in marked if m.endswith("  culprit")]
        assert marked == ["[0][3]", "[1][3].boxes", "[1][3].labels"], marked

"""Object detection shaped like torchvision's references/detection
(programs/detection_lists.py): a batch is a tuple of images of their own sizes and a tuple of
target dicts (``collate_fn``'s ``tuple(zip(*batch))``); a box without width makes the box
coder's ``log(gt_width / anchor_width)`` -inf."""

from __future__ import annotations

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

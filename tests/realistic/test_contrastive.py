"""Contrastive image-text training with open_clip's gradient accumulation
(programs/clip_contrastive.py): a step is a list of micro-batches whose features are cached
under no_grad, then each run again with gradients against the others'. An empty caption in
the data makes the masked mean of its tokens 0/0."""

from __future__ import annotations

import shutil

from replay.store import open_recording
from replay.store.forensics import ForensicsReader
from replay_tui.batchstats import batch_leaves, culprit_parts
from replay_tui.model import RunModel
from tests.conftest import run_py
from tests.realistic.test_real_programs import PROGRAMS, bisect_json, record
from tests.realistic.test_upstream_classes import digests


def test_an_empty_caption_in_an_accumulated_clip_step_is_named_by_micro_batch_and_row(
    tmp_path, elsewhere
):
    """Was: the step's batch, a list of (images, texts) micro-batches, was cut along dim 0 of
    every tensor at once, and bisect named "sample 5": row 5 of which micro-batch, it did not
    say (micro-batch 1 held the empty caption)."""
    run, p = record(tmp_path, "clip_contrastive.py", "--empty-caption", "37")
    assert p.returncode == 1 and "loss is nan at step 13" in p.stderr, p.stderr[-2000:]
    before = digests(tmp_path)

    d = bisect_json(run, elsewhere)
    assert (d["first_bad_step"], d["reproducible"], d["deterministic"]) == (13, True, True), d
    assert (d["cause"], d["op"], d["phase"]) == ("op", "aten::div", "forward"), d
    assert d["source"]["code"].endswith("# masked mean"), d["source"]
    assert d["sample_axes"] == [0, 1] and d["samples"] == [[1, 5]] and d["samples_exact"], d
    assert any("a list of 2 micro-batches" in n for n in d["notes"]), d["notes"]
    with ForensicsReader.open(run.with_suffix(".forensics.h5")) as f:  # the TUI's, the report's
        assert f.verdict["samples"] == [[1, 5]] and f.verdict["sample_layout"] == "micro"
    # replay tui's batch view marks row 5 of micro-batch 1's tensors, and no other row
    with open_recording(str(run)) as rec:
        model = RunModel(rec)
        leaves = batch_leaves(rec.read_step(13)["batch"])
        marks = {lf.path: culprit_parts(lf, *model.culprit_samples()) for lf in leaves}
    assert {p: m for p, m in marks.items() if m != (False, set())} == {
        "[1][0]": (False, {5}),
        "[1][1]": (False, {5}),
    }, marks

    after = digests(tmp_path)
    assert {k: after[k] for k in before} == before  # the run's log, params and recording
    assert set(after) - set(before) == {"run.forensics.h5"}


def test_open_clips_own_order_caching_features_in_the_loop_is_told_while_it_trains(tmp_path):
    """``--wiring closure``: the loop caches each micro-batch's features as it arrives, and
    the step closes over that cache: state no recording holds. The self-check says so on the
    training's stderr before the run ends."""
    shutil.copy(PROGRAMS / "clip_contrastive.py", tmp_path)
    env = {"REPLAY_SELF_CHECK": "1", "REPLAY_SELF_CHECK_NICE": "0"}
    p = run_py(str(tmp_path / "clip_contrastive.py"), "--wiring", "closure", "--until-checked",
               cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    said = [ln for ln in p.stderr.splitlines() if "does NOT replay" in ln]
    assert len(said) == 1 and "outside_state" in said[0], p.stderr[-3000:]
    assert "had not finished" not in p.stderr

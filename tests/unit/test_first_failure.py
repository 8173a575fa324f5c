"""Where a recording first fails is the earliest step whose health shows a failure of either
kind (``Recording.first_failure``), as ``bisect`` with no kind looks for it. The TUI's marks
and the report page took the first non-finite step and an exception only when there was none:
a run whose step 3 raised (the loop went on) and whose loss went NaN at step 5 had its symptom
marked at 5 on both, while ``bisect`` blamed step 3."""

from __future__ import annotations

import numpy as np

from replay.bisect import auto_criterion
from replay.report.facts import read_facts
from replay.store import HEALTH_COLUMNS, open_recording
from replay.store.contracts import HealthFrame
from replay.store.writer import RingSpec, StoreWriter
from tui.model import RunModel


def _recording(path: str, raised: int, nonfinite: int) -> None:
    w = StoreWriter(
        path,
        run_id="e" * 32,
        meta={"config": {}},
        sources={},
        steps=RingSpec(4, 4096, 4096),
        snapshots=RingSpec(2, 4096, 4096),
        health_slots=16,
    )
    col = list(HEALTH_COLUMNS).index
    rows = []
    for s in range(8):
        v = np.zeros(len(HEALTH_COLUMNS))
        v[col("loss")] = np.nan if s == nonfinite else 1.0
        v[col("raised")] = s == raised
        v[col("loss_nonfinite")] = s == nonfinite
        rows.append(HealthFrame(s, v))
    w.commit(health=rows, last_step=7)
    w.close()


def test_an_exception_before_the_first_nan_is_where_the_tui_and_the_page_mark_the_symptom(
    tmp_path,
):
    path = str(tmp_path / "run.h5")
    _recording(path, raised=3, nonfinite=5)
    with open_recording(path) as rec:
        assert rec.first_bad() == {"nonfinite": 5, "exception": 3}
        assert rec.first_failure() == 3
        h = rec.health()
        rows = [{c: h[c][i] for c in h} for i in range(len(h["step"]))]
    assert auto_criterion(rows).kind == "exception"  # what bisect looks for: step 3
    assert read_facts(path).symptom == 3
    model = RunModel.open(path)
    try:
        assert model.marks().symptom == 3 and model.focus_step() == 3
    finally:
        model.close()


def test_a_nan_before_an_exception_is_the_first_failure(tmp_path):
    path = str(tmp_path / "run.h5")
    _recording(path, raised=6, nonfinite=2)
    with open_recording(path) as rec:
        assert rec.first_failure() == 2
    assert read_facts(path).symptom == 2

"""The culprit samples in one wording for ``replay bisect``'s text and the page
(``replay.words.samples_text``)."""

from __future__ import annotations

from replay.reports import TraceVerdict
from replay.words import samples_text


def _v(**kw) -> TraceVerdict:
    return TraceVerdict(kind="nonfinite", **kw)


def test_samples_text_names_rows_dataset_files_axes_and_micro_batches():
    assert samples_text(_v(samples=[3, 17], sample_axes=[0])) == "3, 17"
    src = [{"index": 37, "file": "rows/0037.row"}, {"index": 4, "file": None}]
    got = samples_text(_v(samples=[3, 5], sample_axes=[0], sample_sources=src))
    assert got == "3 (dataset index 37: rows/0037.row), 5 (dataset index 4)"
    assert samples_text(_v(samples=[7], sample_axes=[1])) == "along dim 1: 7"
    got = samples_text(_v(samples=[[2, 5]], sample_axes=[0, 1], samples_exact=False))
    assert got == "[micro-batch, row] along dims 0, 1: [2, 5] (approximate: batch-coupled layers)"


def test_bisect_and_the_page_word_the_samples_alike(example):
    from replay.cli.render import render_verdict
    from replay.report import build_page
    from replay.reports import BisectReport

    text = render_verdict(BisectReport.from_json(example.bisect))
    line = next(s for s in text.splitlines() if s.startswith("  samples"))
    words = line.split(None, 1)[1]
    assert f'<span id="samples">{words}</span>' in build_page(example.traced)

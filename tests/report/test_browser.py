"""The page in a real browser (headless Chromium, network blocked): what a reader sees."""

from __future__ import annotations

from pathlib import Path

from replay.report import write_report
from replay.reports import BisectReport
from replay.store.forensics import ForensicsReader

from .conftest import artifact


def _write(example, tmp_path: Path, run: str, name: str) -> str:
    out = tmp_path / name
    write_report(run, str(out), bisect=BisectReport.from_json(example.bisect))
    return str(out)


def test_verdict_first_bad_step_and_culprit_op_are_visible_and_nothing_is_fetched(
    example, tmp_path, open_page
):
    got = open_page(_write(example, tmp_path, example.traced, "report.html"))
    page = got.page
    step = example.bisect["first_bad_step"]
    assert page.locator("#first-bad").inner_text() == str(step)
    assert page.locator("#first-bad").is_visible()
    assert "aten::div" in page.locator("#culprit-op").inner_text()
    assert page.locator("#culprit-op").is_visible()
    # the first bad step is marked on the loss plot, its label drawn
    mark = page.locator(f'#plot-loss g.mark.bad[data-step="{step}"]')
    assert mark.is_visible() and mark.text_content() == f"first bad step {step}"
    # the culprit's row, scrolled into its box by the page's script
    with ForensicsReader.open(example.traced.replace(".h5", ".forensics.h5")) as f:
        culprit = f.verdict["op_index"]
    row = page.locator(f"tr#op-{culprit}")
    assert row.is_visible() and "aten::div" in row.inner_text()
    page.screenshot(path=str(artifact("sqrt_at_zero.png")), full_page=True)
    assert got.requests == [Path(tmp_path / "report.html").resolve().as_uri()]
    assert got.console == [] and got.errors == []


def test_the_ops_table_sorts_and_filters(example, tmp_path, open_page):
    page = open_page(_write(example, tmp_path, example.traced, "report.html")).page
    first = page.locator("#ops tbody tr").first
    assert first.get_attribute("id") == "op-0"
    page.locator("#ops thead th", has_text="#").click()  # ascending already: now descending
    page.locator("#ops thead th", has_text="#").click()
    assert page.locator("#ops thead th", has_text="#").get_attribute("aria-sort") == "descending"
    assert page.locator("#ops tbody tr").first.get_attribute("id") != "op-0"
    page.locator("#ops-filter").fill("aten::div backward")
    shown = [r for r in page.locator("#ops tbody tr").all() if r.is_visible()]
    assert shown and all("aten::div" in r.inner_text() for r in shown)


def test_the_page_reads_without_javascript(example, tmp_path, open_page):
    got = open_page(_write(example, tmp_path, example.traced, "report.html"), javascript=False)
    page = got.page
    assert page.locator("#first-bad").is_visible()
    assert page.locator("#ops tbody tr").count() > 10  # every row there, unsorted
    assert page.locator("#ops-filter").count() == 0  # the script adds the filter box only


def test_without_a_sidecar_the_recording_alone_is_shown(example, tmp_path, open_page):
    got = open_page(_write(example, tmp_path, example.plain, "plain.html"))
    page = got.page
    assert "replay bisect" in page.locator("#no-forensics").inner_text()
    step = page.locator("#first-bad").inner_text().split()[-1]
    mark = page.locator(f'#plot-loss g.mark.bad[data-step="{step}"]')
    assert mark.is_visible() and mark.text_content() == f"first NaN/Inf recorded at {step}"
    page.screenshot(path=str(artifact("sqrt_at_zero-no-sidecar.png")), full_page=True)
    assert len(got.requests) == 1 and got.console == []

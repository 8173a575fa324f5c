"""benchmarks/bench_report.py still runs against the report as it is (no timing asserted)."""

from __future__ import annotations

import re

from tests.conftest import ROOT, run_py


def test_bench_report_writes_both_pages(tmp_path):
    proc = run_py(
        str(ROOT / "benchmarks" / "bench_report.py"),
        "--steps", "30", "--ops", "3000", "--repeat", "1", "--dir", str(tmp_path),
        timeout=300,
        check=True,
    )  # fmt: skip
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| the recording")]
    assert len(rows) == 2 and all(re.search(r"\d+ KiB \| \d+\.\d\d \|", r) for r in rows), (
        proc.stdout
    )
    page = (tmp_path / "traced.html").read_text()
    assert "of the 3,000 of step" in page

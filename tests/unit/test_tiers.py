"""tests/tiers.py names real tests: a matrix entry that matches nothing (a renamed test) would
leave a case in neither tier's account, or quietly keep a slow one in `make test`."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import COLLECTED, ROOT
from tests.tiers import MATRIX


def test_every_matrix_entry_names_a_collected_test():
    files = sorted({prefix.split("::")[0] for prefix in MATRIX})
    ids = list(COLLECTED)  # the suite's own collection, before `-m "not matrix"` deselected
    if not all(any(i.startswith(f + "::") for i in ids) for f in files):
        ids = _collect(files)  # this file run alone: collect the files the entries name
    for prefix in MATRIX:
        assert any(i.startswith(prefix) for i in ids), f"{prefix} matches no test"


def _collect(files: list[str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "matrix", "-p", "no:xdist", *files],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    return [ln.strip() for ln in out.splitlines() if "::" in ln]

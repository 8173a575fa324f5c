"""tests/tiers.py names real tests: a matrix entry that matches nothing (a renamed test) would
leave a case in neither tier's account, or quietly keep a slow one in `make test`."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT
from tests.tiers import MATRIX


def test_every_matrix_entry_names_a_collected_test():
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "matrix", "-p", "no:xdist"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    ids = [ln.strip() for ln in out.splitlines() if "::" in ln]
    for prefix in MATRIX:
        assert any(i.startswith(prefix) for i in ids), f"{prefix} matches no test"

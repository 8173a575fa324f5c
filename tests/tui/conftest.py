"""Recordings for the TUI tests, made by a real training loop in a subprocess (once a session).

``traced/run.h5`` + ``traced/run.forensics.h5`` (step 6 traced: a 0/0 in ``body.0.norm``),
``plain/run.h5`` (the same recording without forensics), ``big/`` (the same recording with a
synthetic 200,000-op sidecar). Fixed folder names keep what the screens show stable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from synthetic import write_synthetic

from replay.store import open_recording
from tests.conftest import run_env

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("tui-runs", numbered=False)
    traced = base / "traced"
    traced.mkdir()
    shutil.copy(os.path.join(HERE, "train_fixture.py"), traced)
    subprocess.run(
        [sys.executable, "train_fixture.py", str(traced), "--trace"],
        cwd=traced,
        env=run_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    plain = base / "plain"
    plain.mkdir()
    shutil.copy(traced / "run.h5", plain / "run.h5")
    big = base / "big"
    big.mkdir()
    shutil.copy(traced / "run.h5", big / "run.h5")
    with open_recording(str(big / "run.h5")) as rec:
        culprit = write_synthetic(str(big / "run.forensics.h5"), rec.run_id)
    return {
        "traced": str(traced / "run.h5"),
        "plain": str(plain / "run.h5"),
        "big": str(big / "run.h5"),
        "big_culprit": str(culprit),
    }

"""Recordings for the doctor tests: the examples' own training loops, run in-process once per
session (one torch import), plus the tiny loops of doctor_loops.py."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import warnings
from pathlib import Path

import pytest

from replay.errors import RecorderWarning

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run_example(name: str, path: str) -> str:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[spec.name] = mod  # the Recorder checks that its entry points are importable
    spec.loader.exec_module(mod)
    with contextlib.redirect_stdout(io.StringIO()):
        mod.main(path)
    return path


@pytest.fixture(scope="session")
def recording(tmp_path_factory):
    """``recording(name)``: path of examples/<name>.py's recording, or of a doctor_loops variant
    when name is ``loop:<variant>``. Each is recorded once per session."""
    cache: dict[str, str] = {}
    root = tmp_path_factory.mktemp("doctor")

    def get(name: str) -> str:
        if name not in cache:
            path = str(root / f"{name.replace(':', '_')}.h5")
            # On a loaded machine the writer process lags and the Recorder says so (a warning,
            # an error under the suite's filterwarnings): what these runs hold is unchanged.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "replay: training waited", RecorderWarning)
                if name.startswith("loop:"):
                    import doctor_loops

                    cache[name] = doctor_loops.record(path, name.split(":", 1)[1])
                else:
                    cache[name] = _run_example(name, path)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def findings(recording):
    """``findings(name) -> {rule: Finding}`` for a recording (diagnosed once per session)."""
    from replay.doctor import diagnose

    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = {f.rule: f for f in diagnose(recording(name))}
        return cache[name]

    return get

"""Reach: with default settings, a step thousands of steps back is replayed bitwise.

A 3,000-step run of a tiny model, recorded with a plain ``replay.Recorder`` (default settings),
whose batch at step 300 is scaled by 1e3: a finite gradient-norm spike, clipped, training goes
on. The dense snapshots cover only the last 150 steps; the sparse ones and the kept batches
reach step 300, so bisect names it and replays it bitwise.
"""

from pathlib import Path

import pytest
from recorded_runs import cli, cli_json

from tests.conftest import run_py

SCRIPT = Path(__file__).with_name("scripts") / "reach_spike.py"


def _record(tmp_path: Path, *extra: str) -> Path:
    run = tmp_path / "run.h5"
    p = run_py(str(SCRIPT), str(run), "--steps", "3000", "--at", "300", *extra, timeout=300)
    assert p.returncode == 0, p.stderr
    return run


@pytest.fixture(scope="module")
def spiked(tmp_path_factory) -> Path:
    return _record(tmp_path_factory.mktemp("reach"))


@pytest.mark.slow
def test_a_spike_2700_steps_back_is_found_and_replayed_bitwise_with_default_settings(spiked):
    run = spiked
    info = cli("info", str(run))
    assert info.returncode == 0, info.stderr
    assert "replayable      steps 0..2999" in info.stdout
    assert "reach           any step of the last 10,000" in info.stdout
    rc, d, err = cli_json("bisect", str(run), "--until", "grad_norm > 50")
    assert rc == 0, err
    assert d["first_bad_step"] == 300
    assert d["reproducible"] is True and d["deterministic"] is True
    assert float(d["grad_norm"]) > 50


@pytest.mark.slow
def test_verify_replays_the_newest_snapshots_steps_unless_asked_for_more(spiked):
    """A 3,000-step window would take as long to verify as to train: by default verify replays
    the dense part and says how to ask for the rest."""
    rc, d, err = cli_json("verify", str(spiked))
    assert rc == 0 and d["deterministic"] is True, err
    assert d["window"] == [2850, 2999] and d["replayed_steps"] == 150, d["window"]
    assert any("--all" in n and "back to step 0" in n for n in d["notes"]), d["notes"]
    rc, d, err = cli_json("verify", str(spiked), "--from", "2920")
    assert rc == 0 and d["window"] == [2900, 2999], (d.get("window"), err)

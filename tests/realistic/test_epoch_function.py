"""Programs whose step lives inside a per-epoch function (timm's ``train.py``, torchvision's
classification reference), wired where the step is: the Recorder opened once in ``main()``
without a step function, each step handed over with ``replay.step(batch, step_fn)`` from inside
``train_one_epoch``, the step function a closure made again for every batch. Each is trained on
a small ImageFolder-like folder of ``.npy`` images made here (no PIL in the venv): a NaN pixel in
one image is bisected to cause data and that sample, and a healthy run verifies bitwise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.realistic.test_real_programs import PROGRAMS, record, replay

BAD = 13  # the image with a NaN pixel: batch 1 (batches of 8, not shuffled), sample 5


def image_folder(root: Path, *, nan_at: int | None) -> None:
    """32 images 3x8x8 in two class folders (16 each), as ImageFolder lays them out."""
    g = np.random.default_rng(0)
    for k in range(2):
        (root / f"class{k}").mkdir(parents=True)
        for j in range(16):
            x = (g.standard_normal((3, 8, 8)) + k).astype(np.float32)
            if k * 16 + j == nan_at:
                x[1, 4, 4] = np.nan
            np.save(root / f"class{k}" / f"img{j:03d}.npy", x)


def wired_lines(program: str) -> int:
    return sum(
        1
        for line in (PROGRAMS / program).read_text().splitlines()
        if re.search(r"#\s*replay\s*($|#)", line)
    )


PROGRAMS_WIRED = ["timm_train.py", "torchvision_train.py"]


@pytest.mark.parametrize("program", PROGRAMS_WIRED)
def test_an_epoch_function_program_is_wired_in_at_most_six_lines(program):
    assert 0 < wired_lines(program) <= 6


@pytest.mark.parametrize("program", PROGRAMS_WIRED)
def test_a_nan_pixel_in_one_image_is_bisected_to_that_sample_through_the_epoch_function(
    tmp_path, program
):
    image_folder(tmp_path / "data", nan_at=BAD)
    run, p = record(tmp_path, program, "data", "--record", "run.h5", "--model-ema")
    assert run.exists(), p.stderr[-2000:]
    d = json.loads(replay("bisect", str(run), "--json", cwd=tmp_path).stdout)
    assert (d["first_bad_step"], d["cause"]) == (1, "data"), d
    assert [t["name"] for t in d["data"]["tensors"]] == ["batch[0]"], d["data"]
    assert d["samples"] == [BAD % 8] and d["reproducible"] is True, d["notes"]


@pytest.mark.parametrize("program", PROGRAMS_WIRED)
def test_a_healthy_epoch_function_run_verifies_bitwise_with_the_closure_recorded_once(
    tmp_path, program
):
    image_folder(tmp_path / "data", nan_at=None)
    run, p = record(tmp_path, program, "data", "--record", "run.h5", "--model-ema")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "does not hold" not in p.stderr and "another step function" not in p.stderr, p.stderr
    assert "than the step before" not in p.stderr, p.stderr  # the closures: over the same objects
    v = replay("verify", str(run), "--json", cwd=tmp_path)
    assert v.returncode == 0, v.stdout[-2000:] + v.stderr[-2000:]
    info = replay("info", str(run), cwd=tmp_path).stdout
    assert "train_one_epoch.<locals>" in info, info


def test_replay_step_with_no_recorder_open_says_so_in_one_line():
    import replay

    with pytest.raises(replay.ReplayError, match="no replay.Recorder is open in this process"):
        replay.step((1, 2), lambda batch: 0.0)

"""Random byte flips in a real recording, through `replay info` and `replay doctor`: whatever a
damaged or crafted byte does, the answer is 0 or 3, one line, no traceback, no hang.

Found two hangs of minutes before the SWMR read attempts were capped (replay/store/reader.py).
A fixed seed: the same mutants every run."""

from __future__ import annotations

import random

import pytest

from .corpus import BAD, OK
from .test_cli_corpus import check, run_replay

MUTANTS = 24


@pytest.mark.parametrize("seed", range(MUTANTS))
def test_flipped_bytes(real_recording, tmp_path, seed):
    rng = random.Random(seed)
    data = bytearray(real_recording.read_bytes())
    limit = 4096 if seed % 2 == 0 else len(data)  # even seeds: the metadata at the start
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(limit)] = rng.randrange(256)
    path = tmp_path / "run.h5"
    path.write_bytes(bytes(data))
    for command in ("info", "doctor"):
        proc = run_replay(command, str(path), limit_memory=True)
        check(proc, -1, "", f"{command} of mutant {seed}")
        assert proc.returncode in (OK, BAD)

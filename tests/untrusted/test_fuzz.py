"""Random byte flips in a real recording, through `replay info` and `replay doctor`: whatever a
damaged or crafted byte does, the answer is 0 or 3, one line, no traceback, no hang.

Found two hangs of minutes before the SWMR read attempts were capped (replay/store/reader.py).
A fixed seed: the same mutants every run."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from .corpus import BAD, OK
from .test_cli_corpus import bounded_codes, check, run_replay

MUTANTS = 24


def _mutant(real_recording: Path, directory: Path, seed: int) -> Path:
    rng = random.Random(seed)
    data = bytearray(real_recording.read_bytes())
    limit = 4096 if seed % 2 == 0 else len(data)  # even seeds: the metadata at the start
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(limit)] = rng.randrange(256)
    directory.mkdir(exist_ok=True)
    path = directory / "run.h5"
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("seed", range(MUTANTS))
def test_flipped_bytes(real_recording, tmp_path, seed):
    path = _mutant(real_recording, tmp_path, seed)
    for command in ("info", "doctor"):
        proc = run_replay(command, str(path))
        check(proc, -1, "", f"{command} of mutant {seed}")
        assert proc.returncode in (OK, BAD)


def test_flipped_bytes_within_bounded_memory(real_recording, tmp_path):
    """Every mutant again, in one child per command limited to 2 GiB of address space."""
    paths = {str(s): str(_mutant(real_recording, tmp_path / str(s), s)) for s in range(MUTANTS)}
    for command in ("info", "doctor"):
        for seed, (code, tail) in bounded_codes(command, paths).items():
            assert code in (OK, BAD), f"{command} of mutant {seed}: exit {code}: {tail}"

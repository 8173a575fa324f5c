"""Ring rows are written with direct chunk writes (past HDF5's chunk cache): the payload must
read back exactly whatever its length relative to the chunk, after the arena grows, and when a
short payload overwrites a longer one in the same slot."""

import numpy as np
import pytest

from replay.store.contracts import HealthFrame, StepFrame
from replay.store.layout import HEALTH_COLUMNS
from replay.store.reader import open_recording
from replay.store.writer import RingSpec, StoreWriter, pack_parts

CHUNK = 4096


@pytest.mark.parametrize(
    "sizes",
    [
        [10, CHUNK, CHUNK + 1, 3 * CHUNK],  # partial, exact, one byte over, a multiple
        [5 * CHUNK + 7, 100],  # grows the arena, then a short one reuses slot 0's ring
    ],
)
def test_direct_chunk_rows_read_back_bit_for_bit(tmp_path, sizes):
    path = str(tmp_path / "r.h5")
    w = StoreWriter(
        path,
        run_id="t",
        meta={},
        sources={},
        steps=RingSpec(2, CHUNK, 2 * CHUNK),
        snapshots=RingSpec(2, CHUNK, CHUNK),
        health_slots=8,
    )
    rng = np.random.default_rng(0)
    expect = {}
    for t, n in enumerate(sizes):
        x = rng.integers(0, 256, n, dtype=np.uint8)
        payload, mlen = pack_parts({"step": t, "batch": x})
        w.commit(
            steps=[StepFrame(t, payload, mlen)],
            health=[HealthFrame(t, np.zeros(len(HEALTH_COLUMNS)))],
            last_step=t,
        )
        expect[t] = x
    w.close(clean=True)
    with open_recording(path) as rec:
        kept = rec.steps().tolist()
        assert kept == list(range(len(sizes)))[-2:]
        for t in kept:
            got = rec.read_step(t)["batch"]
            assert got.dtype == np.uint8 and np.array_equal(got, expect[t])

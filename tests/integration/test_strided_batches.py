"""A non-contiguous batch replays bitwise (issue 44, item 6). A channels_last image batch or a
transposed one was stored by its values and replayed contiguous: a BatchNorm over the batch,
or its columns' means, gave other bits, and the replay diverged from the recording. The
format keeps a tensor's strides (v4); a replay lays the batch out as recorded."""

from __future__ import annotations

import pytest

from replay.store import open_recording
from tests.conftest import SCRIPTS, replay_json, run_py

SCRIPT = str(SCRIPTS / "strided_batches.py")


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, strides", [("image", (432, 1, 36, 3)), ("transposed", (1, 256))], ids=str
)
def test_a_non_contiguous_batch_replays_bitwise_with_its_strides(tmp_path, mode, strides):
    run = tmp_path / "run.h5"
    p = run_py(SCRIPT, str(run), mode, check=True, cwd=tmp_path)
    said = f"step batch strides {strides}"
    assert p.stdout.splitlines() == [said] * 8, p.stdout
    with open_recording(run) as rec:
        assert rec.read_step(5)["batch"][0].strides == strides
    rc, d, err = replay_json("verify", str(run), cwd=tmp_path)
    assert rc == 0 and d["deterministic"] is True and d["replayed_steps"] == 8, (d, err[-3000:])
    # every step replayed (some twice) printed the strides its batch came with: the recorded
    printed = [ln for ln in err.splitlines() if ln.startswith("step batch strides")]
    assert len(printed) >= 8 and set(printed) == {said}, err[-3000:]

"""A recorded object batch names a class, and a replay makes it without its constructor
(docs/format.md, the ``object`` node). Was: any loaded class would do: a batch recorded as
``tempfile._TemporaryFileCloser`` holding a victim's name deleted the victim when ``replay
verify`` dropped the batch (its finaliser ran), and verify still said every step replays.

One real recording (tests/realistic/programs/object_batches.py, a dataclass batch) has a gadget
added to each step's batch with h5py, as corpus.py crafts files: the standard library's
finalising class, and a class with a finaliser written in the program's own file.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from replay.store import open_recording
from replay.store.tree import ObjectRecord
from tests.conftest import replay_cli, run_py

from .corpus import _put_record

PROGRAM = Path(__file__).parents[1] / "realistic" / "programs" / "object_batches.py"

# A class of the program's own with a finaliser, put into its file before it is recorded.
SCRATCH = """
class Scratch:
    def __del__(self, unlink=__import__("os").unlink):  # bound now: it works at exit too
        unlink(self.path)

"""


@pytest.fixture(scope="module")
def gadget_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("gadgets")
    source = PROGRAM.read_text().replace("\ndef main():", SCRATCH + "\ndef main():", 1)
    (d / "object_batches.py").write_text(source)
    run = d / "run.h5"
    p = run_py(str(d / "object_batches.py"), str(run), "--steps", "12", "--bad", "99", cwd=d)
    assert p.returncode == 0, p.stderr[-2000:]
    victims = (d / "victim_stdlib.txt", d / "victim_own.txt")
    rec = open_recording(str(run))
    try:
        records = {t: rec._record("steps", t) for t in range(12)}
    finally:
        rec.close()
    with h5py.File(run, "r+") as f:
        markers = f["steps/step"][()]
        for slot in np.flatnonzero(markers >= 0):
            r = records[int(markers[slot])]
            closer = ObjectRecord("tempfile", "_TemporaryFileCloser", {})  # .file.close(): no-op
            r["batch"].attrs["stdlib"] = ObjectRecord(
                "tempfile",
                "_TemporaryFileCloser",
                {"file": closer, "name": str(victims[0]), "delete": True},
            )
            r["batch"].attrs["own"] = ObjectRecord("__main__", "Scratch", {"path": str(victims[1])})
            _put_record(f, "steps", int(slot), r)
    return run, *victims


def test_a_gadget_batch_class_is_not_built_and_the_victims_survive_verify(gadget_run) -> None:
    """Neither the standard library's ``_TemporaryFileCloser`` nor the program's own class
    with ``__del__`` is made: both are plain stand-ins, whose dropping deletes nothing. The
    batch itself, a dataclass of the program's file, is still made as its own class: the step
    takes its ``isinstance(batch, Batch)`` branch and every step replays bitwise."""
    run, *victims = gadget_run
    for v in victims:
        v.write_text("mine")
    p = replay_cli("verify", str(run), "--json", "--all", "--trust", cwd=run.parent)
    assert [v.exists() for v in victims] == [True, True], p.stderr[-2000:]
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    assert d["replayed_steps"] == 12 and d["first_divergence"] is None, d
    assert all(s["match"] for s in d["steps"]), d
    assert "tempfile._TemporaryFileCloser is replayed as a plain object" in p.stderr
    assert "__main__.Scratch is replayed as a plain object" in p.stderr
    assert "defines __del__" in p.stderr

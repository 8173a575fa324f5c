"""Rank sets without a process group: ranks recorded in one process with ``rank=``/``world_size=``
overrides (real training loops, real HDF5 files), then resolved, opened and searched."""

from __future__ import annotations

import json
import os
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import replay
from replay.errors import RecordingError
from replay.ranks.files import open_rank_set
from replay.ranks.first_bad import first_bad_rank
from replay.ranks.names import base_path, rank_path, resolve_rank_files
from replay.store import HEALTH_COLUMNS, open_recording


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> Any:
    optimizer.zero_grad()
    loss = model(batch).square().mean()
    loss.backward()
    optimizer.step()
    return loss


def record_rank(
    path: str, rank: int, world: int, nan_step: int | None = None, steps: int = 6
) -> str:
    model, opt = build()
    with replay.Recorder(
        path,
        model=model,
        optimizer=opt,
        step_fn=train_step,
        build_fn=build,
        snapshot_every=2,
        rank=rank,
        world_size=world,
        raise_on_nonfinite=False,
    ) as rec:
        for s in range(steps):
            x = torch.full((3, 4), float(s + rank))
            if s == nan_step:
                x[0, 0] = float("nan")
            rec.step(x)
    return rec.path


def test_rank_file_names() -> None:
    assert rank_path("/d/run.h5", 3) == "/d/run.rank3.h5"
    assert rank_path("/d/run", 0) == "/d/run.rank0.h5"
    assert rank_path("/d/run.rank3.h5", 3) == "/d/run.rank3.h5"  # already this rank's name
    assert base_path("/d/run.rank12.h5") == "/d/run.h5"
    assert base_path("/d/run.h5") is None


def test_overrides_name_and_describe_each_rank(tmp_path: Any) -> None:
    p = record_rank(str(tmp_path / "run.h5"), 1, 2)
    assert os.path.basename(p) == "run.rank1.h5"
    with open_recording(p) as rec:
        assert rec.meta["distributed"] == {
            "rank": 1,
            "world_size": 2,
            "backend": None,
            "local_rank": None,
        }
        # no process group: nothing measured the gradient before an all-reduce
        assert np.isnan(rec.health()["local_grad_norm"]).all()


def test_rank_set_resolution_and_first_bad_rank(tmp_path: Any) -> None:
    base = str(tmp_path / "run.h5")
    for r in range(3):
        record_rank(base, r, 3, nan_step=4 if r == 2 else None)
    files = [str(tmp_path / f"run.rank{r}.h5") for r in range(3)]
    assert resolve_rank_files(base) == files
    assert resolve_rank_files(str(tmp_path)) == files
    assert resolve_rank_files(str(tmp_path / "run.rank*.h5")) == files
    assert resolve_rank_files(files[1]) is None  # one rank file on its own is a plain recording
    with open_rank_set(base) as rs:
        assert rs.world_size == 3 and rs.missing == []
        f = first_bad_rank(rs)
        health = {r: rec.health() for r, rec in rs.recordings.items()}
    assert f is not None and (f.step, f.ranks, f.kind, f.local) == (4, (2,), "nonfinite", True)
    assert sorted(health) == [0, 1, 2] and health[2]["loss_nonfinite"][4] == 1
    os.unlink(files[1])
    with open_rank_set(base) as rs:
        assert rs.missing == [1] and sorted(rs.paths) == [0, 2]


def test_rank_set_errors_are_one_line(tmp_path: Any) -> None:
    record_rank(str(tmp_path / "a.h5"), 0, 2, steps=1)
    record_rank(str(tmp_path / "b.h5"), 0, 2, steps=1)
    with pytest.raises(RecordingError, match="several rank sets"):
        resolve_rank_files(str(tmp_path))
    with pytest.raises(RecordingError, match="matches no file"):
        resolve_rank_files(str(tmp_path / "zzz*.h5"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordingError, match="without rank recordings"):
        resolve_rank_files(str(tmp_path / "empty"))
    record_rank(str(tmp_path / "c.h5"), 0, 2, steps=1)
    record_rank(str(tmp_path / "d.h5"), 1, 3, steps=1)
    with pytest.raises(RecordingError, match="different runs"):
        open_rank_set([str(tmp_path / "c.rank0.h5"), str(tmp_path / "d.rank1.h5")])


def test_reader_tolerates_files_without_the_local_grad_columns(tmp_path: Any) -> None:
    """Files written before the DDP columns were appended hold 16 columns: they read as NaN."""
    model, opt = build()
    path = str(tmp_path / "old.h5")
    with replay.Recorder(
        path, model=model, optimizer=opt, step_fn=train_step, build_fn=build
    ) as rec:
        for _ in range(3):
            rec.step(torch.ones(3, 4))
    old = list(HEALTH_COLUMNS[:16])
    with h5py.File(path, "r+") as f:  # make it exactly what the 16-column writer made
        vals = f["health/values"][()][:, :16]
        del f["health/values"]
        f["health"].create_dataset("values", data=vals)
        f["health"].attrs["columns"] = json.dumps(old)
        del f["health/crc"]  # that writer (format v1) kept no row checksums either
    with open_recording(path) as rec:
        h = rec.health()
        assert rec.health_columns == old
        assert list(h["step"]) == [0, 1, 2] and np.isfinite(h["loss"]).all()
        assert np.isnan(h["local_grad_norm"]).all() and np.isnan(h["local_grad_nonfinite"]).all()


def _three_ranks(tmp_path: Any, nan_rank: int = 2) -> tuple[str, list[str]]:
    base = str(tmp_path / "run.h5")
    for r in range(3):
        record_rank(base, r, 3, nan_step=4 if r == nan_rank else None)
    return base, [str(tmp_path / f"run.rank{r}.h5") for r in range(3)]


def test_scan_finds_the_first_bad_step_and_rank_as_the_serial_reading_does(tmp_path: Any) -> None:
    from replay.ranks.scan import scan_rank_set

    base, files = _three_ranks(tmp_path, nan_rank=1)
    with open_rank_set(base) as rs:
        serial = first_bad_rank(rs)
    for workers in (1, 2):  # in this process, and in a pool of worker processes
        scan = scan_rank_set(files if workers == 1 else base, workers=workers)
        assert scan.first_bad == serial and scan.complete
        assert (scan.first_bad.step, scan.first_bad.ranks) == (4, (1,))
        assert sorted(scan.paths) == [0, 1, 2] and scan.world_size == 3


def test_a_rank_set_with_a_missing_or_damaged_rank_file_is_named_never_guessed_over(
    tmp_path: Any,
) -> None:
    """A gap in the rank numbers, fewer files than the recorded world size, a truncated file:
    each is one line naming the rank, exit code 7 from every command that reads the set."""
    from replay.errors import EXIT_INCOMPLETE_RANKS, IncompleteRankSetError
    from replay.ranks.scan import rank_set
    from tests.conftest import replay_cli

    base, files = _three_ranks(tmp_path)
    assert rank_set(base) is not None
    os.rename(files[1], files[1] + ".away")  # a gap: ranks 0 and 2
    with pytest.raises(IncompleteRankSetError, match=r"no file for rank\(s\) 1\b"):
        rank_set(base)
    os.rename(files[1] + ".away", files[1])
    os.rename(files[2], files[2] + ".away")  # the last rank: fewer files than the world size
    with pytest.raises(IncompleteRankSetError, match=r"incomplete rank set of 3 .*rank\(s\) 2\b"):
        rank_set(base)
    os.rename(files[2] + ".away", files[2])
    size = os.path.getsize(files[0])
    with open(files[0], "r+b") as fh:  # a cut copy
        fh.truncate(size // 2)
    with pytest.raises(IncompleteRankSetError, match=r"rank 0's file run.rank0.h5 is damaged"):
        rank_set(base)
    for cmd in (["info"], ["doctor"], ["bisect"], ["verify"], ["trace", "--step", "3"]):
        p = replay_cli(*cmd, base, timeout=120)
        assert p.returncode == EXIT_INCOMPLETE_RANKS, (cmd, p.stderr)
        err = [ln for ln in p.stderr.splitlines() if ln.startswith("replay: error:")]
        assert len(err) == 1 and "rank 0's file run.rank0.h5 is damaged: truncated" in err[0]
        assert "Traceback" not in p.stderr
    info = replay_cli("info", base, "--json")
    d = json.loads(info.stdout)  # what is readable is listed, then the error
    assert d["complete"] is False and list(d["damaged_ranks"]) == ["0"]
    assert sorted(d["ranks"]) == ["1", "2"] and d["exit_code"] == EXIT_INCOMPLETE_RANKS
    # --rank N --alone names the rank itself: the others' files are not needed
    ok = replay_cli("verify", base, "--rank", "1", "--alone", "--json", timeout=300)
    assert ok.returncode == 0, ok.stderr


def test_one_summary_of_a_rank_set_is_what_info_doctor_and_the_tui_say(tmp_path: Any) -> None:
    """``replay info``, ``replay doctor``, the TUI and the report page read one
    ``RankSetSummary``: its typed rows are the numbers ``info --json`` prints of each rank file,
    its slowest rank is doctor's; a set opened by name is scanned (one set of checks), a damaged
    rank file refused by name."""
    from replay.ranks.scan import rank_set
    from replay.ranks.summary import summarise
    from tests.conftest import replay_cli

    base, files = _three_ranks(tmp_path, nan_rank=1)
    scan = rank_set(base)
    assert scan is not None
    s = summarise(scan)
    assert (s.culprit_step, s.culprit_ranks, s.complete) == (4, (1,), True)
    info = json.loads(replay_cli("info", base, "--json").stdout)
    assert info["summary"] == s.summary and info["first_bad"]["ranks"] == [1]
    for row in s.rows:
        x = info["ranks"][str(row.rank)]
        assert x["path"] == row.path == files[row.rank]
        assert x["steps_recorded"] == row.steps_total == 6
        assert x["health_steps"] == list(row.health_steps or ()) == [0, 5]
        assert x["replayable_window"] == list(row.window or ())
        assert x["last_loss"] == row.last_loss and x["closed_cleanly"] is row.closed
        assert x["own_first_bad"] == ([4, ["loss"]] if row.rank == 1 else None)
    doctor = json.loads(replay_cli("doctor", base, "--json").stdout)
    slow = s.slowest
    assert slow is not None and doctor["slowest"]["rank"] == slow[0].rank
    assert doctor["slowest"]["others_median_step_s"] == slow[1]
    with open_rank_set(scan) as rs:  # the scan's own files, opened
        assert rs.paths == {r: f.path for r, f in scan.ranks.items()}
    with open(files[2], "r+b") as fh:  # a cut rank file is refused by name, never skipped
        fh.truncate(os.path.getsize(files[2]) // 2)
    with pytest.raises(RecordingError, match="rank 2's file run.rank2.h5 is damaged"):
        open_rank_set(base)

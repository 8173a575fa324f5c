"""Names are names: a path that exists is a file before it is a glob, and a rank number is
bounded by the run's world size. Was: an existing ``exp[1].h5`` could not be opened (read as a
glob, it matched no file), and a planted file named ``run.rank2000000000.h5`` beside a run made
``replay info`` list two billion missing ranks: MemoryError, exit 6. Real recordings, made in
this process with ``rank=``/``world_size=`` (test_rank_sets.py), and the real CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from replay.errors import EXIT_BAD_RECORDING, EXIT_INCOMPLETE_RANKS, EXIT_OK
from tests.conftest import replay_here
from tests.unit.test_rank_sets import record_rank


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("two-ranks")
    for r in range(2):
        record_rank(str(d / f"run.rank{r}.h5"), r, 2, steps=3)
    return d


def test_an_existing_file_with_glob_characters_opens(two_ranks: Path, tmp_path: Path) -> None:
    exp = tmp_path / "exp[1].h5"
    shutil.copy(two_ranks / "run.rank0.h5", exp)
    p = replay_here("info", str(exp), "--json")
    assert p.returncode == EXIT_OK, p.stderr
    assert json.loads(p.stdout)["path"] == str(exp)


@pytest.mark.parametrize("rank", [1000, 2_000_000_000])
@pytest.mark.parametrize("content", ["garbage", "copy"])
def test_a_planted_rank_file_beyond_the_world_size_is_named_in_one_line(
    two_ranks: Path, tmp_path: Path, rank: int, content: str
) -> None:
    d = tmp_path / "set"
    shutil.copytree(two_ranks, d)
    planted = d / f"run.rank{rank}.h5"
    if content == "garbage":
        planted.write_bytes(b"not a recording" * 10)
    else:  # a real recording of another run's rank 0, renamed
        shutil.copy(two_ranks / "run.rank0.h5", planted)
    runs = [("info", str(d / "run.h5")), ("info", str(d)), ("info", str(d / "run.rank*.h5"))]
    for cmd, spec in [*runs, ("doctor", str(d / "run.h5"))]:
        p = replay_here(cmd, spec)
        assert p.returncode == EXIT_BAD_RECORDING, (cmd, spec, p.returncode, p.stderr)
        err = p.stderr.strip()
        assert "\n" not in err and "Traceback" not in err, err
        if content == "garbage":
            assert f"run.rank{rank}.h5 is named rank {rank}, beyond the world size 2" in err
        else:
            assert "rank 0 appears twice" in err, err


def test_a_planted_rank_file_beside_a_single_recording(two_ranks: Path, tmp_path: Path) -> None:
    single = tmp_path / "run.h5"
    shutil.copy(two_ranks / "run.rank0.h5", single)
    (tmp_path / "run.rank2000000000.h5").write_bytes(b"x" * 100)
    assert replay_here("info", str(single)).returncode == EXIT_OK  # the file named is the file
    p = replay_here("info", str(tmp_path))  # the directory's only rank file is the planted one
    assert p.returncode == EXIT_BAD_RECORDING, p.stderr
    assert "beyond any world size replay reads" in p.stderr and "\n" not in p.stderr.strip()


def test_missing_ranks_are_listed_as_ranges(tmp_path: Path) -> None:
    for r in (0, 1, 6, 11):
        record_rank(str(tmp_path / f"run.rank{r}.h5"), r, 12, steps=2)
    p = replay_here("info", str(tmp_path / "run.h5"))
    assert p.returncode == EXIT_INCOMPLETE_RANKS, p.stderr
    assert "missing ranks   2..5, 7..10" in p.stdout, p.stdout
    assert "no file for rank(s) 2..5, 7..10" in p.stderr, p.stderr


def test_a_healthy_rank_set_is_bisected_from_its_files_without_replaying_a_rank(
    two_ranks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a rank set no rank of which went bad was replayed, every rank together (their
    program run again in as many processes), to say "healthy"; a single file is not."""
    import replay.workflows.bisect as bisect

    def launched(*a: object, **k: object) -> None:
        raise AssertionError("the ranks were replayed")

    monkeypatch.setattr(bisect, "together", launched)
    p = replay_here("bisect", str(two_ranks / "run.h5"), "--json")
    assert p.returncode == 1, p.stderr  # healthy: nothing found
    d = json.loads(p.stdout)
    assert d["healthy"] is True and d["checked"] == [0, 2] and d.get("ended") is None
    assert d["rank_set"]["first_bad"] is None and d["rank_set"]["ranks"] == [0, 1]
    text = replay_here("bisect", str(two_ranks / "run.h5"))
    assert text.stdout.startswith("healthy: no rank's own values match"), text.stdout

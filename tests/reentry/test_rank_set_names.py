"""Every command that reads a recording takes a DDP rank set by its name (``run.h5`` for
``run.rank0.h5``, ``run.rank1.h5``): they exited 3 ``run.h5: no such file``. One real recording,
made by torchrun with 2 gloo ranks (rank 1 puts a NaN into its batch at step 5), is shared by the
module; each command runs on it from another directory, as a user would."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from replay.store.forensics import ForensicsReader
from tests.conftest import replay_cli, run_py

PROGRAMS = Path(__file__).with_name("programs")
BAD_RANK, BAD_STEP = 1, 5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rank_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``run.h5``: the base name of the 2-rank set torchrun recorded."""
    d = tmp_path_factory.mktemp("torchrun")
    shutil.copy(PROGRAMS / "ddp_torchrun.py", d)
    launch = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    args = ("--steps", "10", "--bad-rank", str(BAD_RANK), "--bad-step", str(BAD_STEP))
    p = run_py(*launch, str(d / "ddp_torchrun.py"), *args, cwd=d, timeout=240)
    assert sorted(f.name for f in d.glob("run.rank*.h5")) == ["run.rank0.h5", "run.rank1.h5"], (
        p.stderr[-3000:]
    )
    assert not (d / "run.h5").exists()
    return d / "run.h5"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d


def _json(*args: str, cwd: Path) -> tuple[int, dict, str]:
    env = {"REPLAY_RANKS_TIMEOUT": "200", "REPLAY_PG_TIMEOUT": "150"}
    p = replay_cli(*args, "--json", cwd=cwd, env=env, timeout=300)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


def test_info_summarises_the_rank_set(rank_set: Path, elsewhere: Path) -> None:
    rc, d, err = _json("info", str(rank_set), cwd=elsewhere)
    assert rc == 0, err
    assert d["world_size"] == 2 and d["complete"] and sorted(d["ranks"]) == ["0", "1"]
    assert d["missing_ranks"] == [] and d["damaged_ranks"] == {}
    assert d["first_bad"]["step"] == BAD_STEP and d["first_bad"]["ranks"] == [BAD_RANK]
    assert all(x["health_steps"][0] == 0 for x in d["ranks"].values())
    text = replay_cli("info", str(rank_set), cwd=elsewhere)
    assert f"first bad at step {BAD_STEP} on rank {BAD_RANK}" in text.stdout, text.stderr


def test_doctor_checks_every_rank(rank_set: Path, elsewhere: Path) -> None:
    rc, d, err = _json("doctor", str(rank_set), cwd=elsewhere)
    assert rc == 0, err
    assert d["first_bad_step"] == BAD_STEP and d["first_bad_ranks"] == [BAD_RANK]
    assert set(d["ranks"]) == {"0", "1"}


def test_trace_replays_every_rank_together_and_traces_each(rank_set: Path, elsewhere: Path) -> None:
    rc, d, err = _json("trace", str(rank_set), "--step", str(BAD_STEP), cwd=elsewhere)
    assert rc == 0, err
    assert d["step"] == BAD_STEP and d["rank"] == BAD_RANK  # the culprit rank leads
    assert d["multi_rank"]["world_size"] == 2 and d["deterministic"] is True
    assert d["op"] is not None  # rank 1's own NaN: the op that made it
    assert set(d["ranks"]) == {"0", "1"}
    # every rank traced its own step into its own sidecar
    for r in (0, 1):
        side = rank_set.with_name(f"run.rank{r}.forensics.h5")
        with ForensicsReader.open(str(side)) as f:
            assert f.step == BAD_STEP
    assert "through DDP's gradient all-reduce" in d["ranks"]["0"]["trace"]["received"]
    # a healthy step: rank 0 leads, nothing non-finite
    rc, d, err = _json("trace", str(rank_set), "--step", "2", cwd=elsewhere)
    assert rc == 0 and d["step"] == 2 and d["op"] is None and d["rank"] == 0, err


def test_whatif_runs_each_experiment_on_every_rank(rank_set: Path, elsewhere: Path) -> None:
    rc, d, err = _json(
        "whatif", str(rank_set), "--scale", "lr=0.5", "--skip-step", "5", cwd=elsewhere
    )
    assert rc == 0, err  # skipping the bad step removes the failure
    assert d["reproduces"] is True and d["baseline_failure"] == BAD_STEP
    assert d["removed_by"] == ["--skip-step 5"]
    assert d["multi_rank"]["leader"] == BAD_RANK and set(d["ranks"]) == {"0", "1"}
    assert all(x["deterministic"] for x in d["ranks"].values())
    assert all(x["removed_by"] == ["--skip-step 5"] for x in d["ranks"].values())
    p = replay_cli("whatif", str(rank_set), "--drop-samples", "5:1", cwd=elsewhere)
    assert p.returncode == 2 and "rank set" in p.stderr
    # Was: a change the files refuse started every rank, which imported the program, and each
    # refused it there. Now refused from the files, as for one recording: nothing runs.
    for change, said in (
        (("--set", "nosuch=1"), "the recording has no hyper-parameter 'nosuch'"),
        (("--skip-step", "999"), "--skip-step 999: step 999"),
    ):
        p = replay_cli("whatif", str(rank_set), *change, cwd=elsewhere)
        assert p.returncode == 2 and said in p.stderr, p.stderr[-2000:]
        assert "it has: " in p.stderr or "nosuch" not in said
        assert "replaying" not in p.stderr and "importing" not in p.stderr, p.stderr


def test_the_process_that_replays_the_ranks_together_loads_no_torch(
    rank_set: Path, elsewhere: Path
) -> None:
    """The command's own process only starts the ranks and gathers what they say. Was: it read
    two timeouts through the engine's package, which imports torch (~2 s of CPU a command,
    before any rank started)."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.stderr))\n"
        "from replay.cli import main\n"
        f"main(['verify', {str(rank_set)!r}, '--from', '8', '--json'])\n"
    )
    env = {"REPLAY_RANKS_TIMEOUT": "200", "REPLAY_PG_TIMEOUT": "150"}
    p = run_py("-c", code, cwd=elsewhere, env=env, timeout=300, fresh=True)
    assert p.returncode == 0 and json.loads(p.stdout)["deterministic"] is True, p.stderr[-3000:]
    assert "torch loaded: False" in p.stderr, p.stderr[-3000:]


def test_export_writes_each_ranks_state(rank_set: Path, elsewhere: Path) -> None:
    out = elsewhere / "ckpt"
    rc, d, err = _json("export", str(rank_set), "--out", str(out), "--step", "5", cwd=elsewhere)
    assert rc == 0, err
    assert d["step"] == 5 and d["snapshot"] == 4 and d["verified"] == 1
    assert sorted(d["ranks"]) == ["0", "1"]
    assert sorted(os.listdir(out)) == ["rank0", "rank1"]
    models = [torch.load(out / f"rank{r}" / "model.pt") for r in (0, 1)]
    assert models[0].keys() == models[1].keys()
    for k in models[0]:  # DDP keeps the ranks' parameters equal: so must their states
        assert torch.equal(models[0][k], models[1][k]), k
    rng = [torch.load(out / f"rank{r}" / "rng.pt") for r in (0, 1)]
    assert rng[0]["python"] is not None
    skip = json.loads((out / "rank1" / "skip.json").read_text())
    assert skip["resume_step"] == 5 and skip["first_bad"] == BAD_STEP
    readme = (out / "rank0" / "README.md").read_text()
    assert str(out / "rank0") in readme  # where it is now, not where it was staged


def test_tui_opens_the_rank_set(rank_set: Path) -> None:
    from replay_tui.model import RunModel

    model = RunModel.open(str(rank_set))
    try:
        assert model.rec.path.endswith(f"run.rank{BAD_RANK}.h5")  # the culprit rank's file
        summary = model.ranks  # every rank's summary, kept beside it
    finally:
        model.close()
    assert summary is not None
    assert summary.culprit_step == BAD_STEP and summary.culprit_ranks == (BAD_RANK,)
    assert [r.rank for r in summary.rows] == [0, 1]

"""DDP with the gloo backend on the CPU: two real processes per test (about 6-8 s each).

Two ways to replay a rank set. Alone (``--rank N --alone``, and ``replay_rank_step`` below): a
single-process replay of rank r's step from a snapshot reproduces that rank's *local* loss and
*local* gradient norm (``local_grad_norm``, taken before the all-reduce) bit for bit, but the
recorded run then updated the parameters with the average of every rank's gradients, so only the
first step after a snapshot is exact. Together (the default of ``replay verify``/``bisect`` on a
rank set): one process per rank, a gloo process group, the model in DDP, and every step of every
rank is the recording bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from typing import Any

import ddp_worker
import h5py
import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from replay.capture.fingerprint import grad_norm, param_fingerprint
from replay.capture.rng import restore_rng
from replay.capture.tensors import from_leaves
from replay.child import free_port
from replay.ranks.files import open_rank_set
from replay.ranks.first_bad import first_bad_rank
from replay.store import open_recording
from tests.conftest import replay_here, run_env, run_py

HERE = os.path.dirname(os.path.abspath(__file__))

JOIN_TIMEOUT = 90.0


def run_ranks(tmp_path: Any, **cfg: Any) -> dict[int, dict[str, Any]]:
    """Spawn the ranks and join them with a timeout: a hang fails the test, never blocks it."""
    out = tmp_path / "out"
    out.mkdir()
    cfg = {
        "port": free_port(),
        "world_size": 2,
        "path": str(tmp_path / "run.h5"),
        "out": str(out),
        **cfg,
    }
    ctx = mp.start_processes(
        ddp_worker.worker, args=(cfg,), nprocs=cfg["world_size"], join=False, start_method="spawn"
    )
    deadline = time.monotonic() + JOIN_TIMEOUT
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"ranks still running after {JOIN_TIMEOUT:.0f} s: some rank hangs")
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(cfg["world_size"])}


def replay_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m replay ARGS`` with the recorded entry module (ddp_worker) importable, as in
    the user's training directory; a multi-rank replay gets short timeouts (a hang fails)."""
    env = {**run_env(HERE), "REPLAY_RANKS_TIMEOUT": "110", "REPLAY_PG_TIMEOUT": "90"}
    return run_py("-m", "replay", *args, env=env, timeout=timeout)


def replay_rank_step(path: str, step: int) -> dict[str, float]:
    """Replay ``step`` of one rank file in this process, from the snapshot taken before it."""
    torch.set_num_threads(1)  # as recorded (meta.env.num_threads)
    with open_recording(path) as rec:
        snap, record = rec.read_snapshot(step), rec.read_step(step)
    model, opt = ddp_worker.build()
    model.load_state_dict(from_leaves(snap["model"]))
    opt.load_state_dict(from_leaves(snap["optimizer"]))
    for m, mode in zip(model.modules(), record["modes"]):
        m.training = bool(mode)
    seen: dict[str, float] = {}
    params = [p for g in opt.param_groups for p in g["params"]]
    opt.register_step_pre_hook(lambda *_: seen.update(grad_norm=float(grad_norm(params))))
    restore_rng(record["rng"])
    loss = ddp_worker.train_step(model, opt, from_leaves(record["batch"]))
    seen.update(
        loss=float(loss.detach()),
        param_fingerprint=float(param_fingerprint(list(model.parameters()))),
    )
    return seen


def test_healthy_ddp_run_replays_bitwise_per_rank(tmp_path: Any) -> None:
    threads = torch.get_num_threads()
    results = run_ranks(tmp_path, steps=6, snapshot_every=2, count_steps=[3, 4])
    assert all(r["finished"] for r in results.values()), results
    for r in results.values():  # the stop's votes ride DDP's own all-reduce
        assert r["collectives"] == {"3": r["bare_collectives"], "4": r["bare_collectives"]}
    with open_rank_set(str(tmp_path / "run.h5")) as rs:
        assert sorted(rs.paths) == [0, 1]
        assert os.path.basename(rs.paths[1]) == "run.rank1.h5"
        assert first_bad_rank(rs) is None
        for r, rec in rs.recordings.items():
            assert rec.meta["distributed"] == {
                "rank": r,
                "world_size": 2,
                "backend": "gloo",
                "local_rank": None,
            }
            # The inner module's state: loadable into what build_fn returns.
            assert not any(k.startswith("module.") for k in rec.read_snapshot(0)["model"])
            assert rec.meta["model"]["class"] == "torch.nn.modules.container.Sequential"
        health = {r: rec.health() for r, rec in rs.recordings.items()}
    try:
        for r in (0, 1):
            h = health[r]
            assert list(h["step"]) == list(range(6))
            assert (h["local_grad_nonfinite"] == 0).all()
            # after the all-reduce both ranks hold the same averaged gradient, not their own
            assert (h["grad_norm"] == health[1 - r]["grad_norm"]).all()
            assert (h["local_grad_norm"] != h["grad_norm"]).all()
            for s in (0, 2, 4):  # every snapshot step replays exactly on every rank
                i = int(s)
                got = replay_rank_step(str(tmp_path / f"run.rank{r}.h5"), s)
                assert got["loss"] == h["loss"][i], (r, s)
                assert got["grad_norm"] == h["local_grad_norm"][i], (r, s)
                # parameters were updated with the ranks' average: not comparable alone
                assert got["param_fingerprint"] != h["param_fingerprint"][i]
    finally:
        torch.set_num_threads(threads)


def test_nan_on_one_rank_stops_every_rank_at_the_same_step(tmp_path: Any) -> None:
    results = run_ranks(tmp_path, steps=10, snapshot_every=2, nan_rank=1, nan_step=5)
    for r in (0, 1):
        assert results[r]["error"] == "NonFiniteLossError", results
        assert results[r]["step"] == 5 and results[r]["ranks"] == [1], results
    assert "on rank 1 at step 5" in results[0]["message"]
    # Was: rank 1 then also warned, as recording ended, that its NaN loss of step 5 had found
    # no reduction to carry it and "nobody stopped" (minGPT-ddp at lr 1e9 said so on both ranks)
    for r in (0, 1):
        assert not [w for w in results[r]["warnings"] if "nobody stopped" in w], results[r]
    base = str(tmp_path / "run.h5")
    assert f"replay bisect {base}" in results[0]["message"]
    with open_rank_set(base) as rs:
        assert {r: rec.status()["last_step"] for r, rec in rs.recordings.items()} == {0: 5, 1: 5}
        assert all(rec.closed_cleanly for rec in rs.recordings.values())
        h0, h1 = (rs.recordings[r].health() for r in (0, 1))
        # Both ranks' averaged gradients went NaN at step 5; only rank 1's own did.
        assert h0["grad_nonfinite"][5] == 1 and h1["grad_nonfinite"][5] == 1
        assert h0["local_grad_nonfinite"][5] == 0 and h0["loss_nonfinite"][5] == 0
        assert h1["local_grad_nonfinite"][5] == 1 and h1["loss_nonfinite"][5] == 1
        failure = first_bad_rank(rs)
        assert failure is not None
        assert (failure.step, failure.ranks, failure.kind) == (5, (1,), "nonfinite")
        assert failure.evidence[1] == ["loss", "local_grad"]
    info = replay_here("info", base)
    assert info.returncode == 0, info.stderr
    assert "rank set of 2" in info.stdout
    assert "first bad at step 5 on rank 1" in info.stdout
    # One rank alone, in this process: the old path, labelled approximate.
    bisect = replay_cli("bisect", base, "--alone", "--no-trace", "--json")
    assert bisect.returncode == 0, bisect.stderr
    verdict = json.loads(bisect.stdout)
    assert verdict["approximate"] is True
    assert any("replayed alone" in n for n in verdict["notes"])
    assert verdict["rank_set"]["replayed_rank"] == 1
    assert verdict["rank_set"]["first_bad"] == {
        "step": 5,
        "ranks": [1],
        "kind": "nonfinite",
        "local": True,
    }
    assert verdict["recording"].endswith("run.rank1.h5")
    assert verdict["first_bad_step"] == 5 and verdict["reproducible"] is True


def test_verify_replays_every_rank_together_bitwise(tmp_path: Any) -> None:
    """Issue 21: the ranks replayed together, with DDP's all-reduce, are the run on every rank;
    one rank alone is not (and says so)."""
    run_ranks(tmp_path, steps=6, snapshot_every=2)
    base = str(tmp_path / "run.h5")
    # one run: rank 0's id, broadcast to every rank (docs/trust.md)
    ids = set()
    for r in (0, 1):
        with h5py.File(tmp_path / f"run.rank{r}.h5", "r") as f:
            ids.add(str(f.attrs["run_id"]))
    assert len(ids) == 1
    out = replay_cli("verify", base, "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["deterministic"] is True
    assert d["multi_rank"] == {
        "world_size": 2,
        "backend": "gloo",
        "leader": 0,
        "approximate": False,
    }
    assert [s["step"] for s in d["steps"]] == list(range(6))
    assert all(s["match"] and s["compared"] for s in d["steps"])
    for r in ("0", "1"):
        rank = d["ranks"][r]
        assert rank["recording"].endswith(f"run.rank{r}.h5")
        assert rank["replayed_steps"] == list(range(6)) and rank["compared"] == 6
        assert rank["deterministic"] is True and rank["divergence"] is None, rank

    alone = replay_cli("verify", base, "--rank", "1", "--alone", "--json")
    assert alone.returncode == 1, alone.stderr  # its own gradients instead of the average
    a = json.loads(alone.stdout)
    assert a["approximate"] is True and a["deterministic"] is False
    assert a["first_divergence"]["column"] == "param_fingerprint"
    assert a["recording"].endswith("run.rank1.h5")
    first = json.loads(replay_cli("verify", base, "--alone", "--json").stdout)  # no --rank: 0
    assert first["approximate"] is True and first["recording"].endswith("run.rank0.h5")

    misuse = replay_cli("verify", base, "--rank", "1")
    assert misuse.returncode == 2 and "--alone" in misuse.stderr

    # A rank that fails ends every rank at once, with one line naming it.
    (tmp_path / "entry.py").write_text(
        "import os\n"
        "from ddp_worker import build as _build, train_step\n\n"
        "def build():\n"
        "    if os.environ['RANK'] == '1':\n"
        "        raise RuntimeError('rank 1 cannot build')\n"
        "    return _build()\n"
    )
    t0 = time.monotonic()
    bad = replay_cli("verify", base, "--entry", f"{tmp_path / 'entry.py'}:build,train_step")
    assert bad.returncode == 4, bad.stderr
    assert "rank 1: build_fn build() raised RuntimeError: rank 1 cannot build" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) <= 3, bad.stderr
    assert time.monotonic() - t0 < 60

    # A step that raises on one rank only on replay (its peers would wait in the all-reduce it
    # never joins until the process group times out) ends the replay at once, naming it.
    (tmp_path / "entry2.py").write_text(
        "import os\n"
        "from ddp_worker import build, train_step as _step\n\n"
        "def train_step(model, optimizer, batch):\n"
        "    if os.environ['RANK'] == '1' and optimizer.state and batch[0][0, 0] > -9:\n"
        "        raise KeyError('a global the loop set')\n"
        "    return _step(model, optimizer, batch)\n"
    )
    t0 = time.monotonic()
    bad = replay_cli("verify", base, "--entry", f"{tmp_path / 'entry2.py'}:build,train_step")
    assert bad.returncode == 5, bad.stderr
    assert "rank 1: the replay of step 1 raised KeyError" in bad.stderr, bad.stderr
    assert time.monotonic() - t0 < 60  # not the process group's 90 s timeout


def test_bisect_replays_every_rank_and_names_the_rank_step_and_op(tmp_path: Any) -> None:
    """Issue 21: an inf in rank 1's batch at step 5; the ranks replayed together find it at
    (rank 1, step 5, the first op that read it), deterministic on every rank, and rank 0's trace
    says the non-finite values reached it through the all-reduce."""
    run_ranks(tmp_path, steps=8, snapshot_every=2, inf_rank=1, inf_step=5)
    base = str(tmp_path / "run.h5")
    out = replay_cli("bisect", base, "--json")
    assert out.returncode == 0, out.stderr
    v = json.loads(out.stdout)
    assert (v["rank"], v["first_bad_step"]) == (1, 5)
    assert v["rank_set"]["first_bad"]["ranks"] == [1]
    assert v["deterministic"] is True and v["reproducible"] is True
    assert v["multi_rank"]["approximate"] is False and v["multi_rank"]["leader"] == 1
    assert (v["op"], v["phase"], v["cause"]) == ("aten::addmm", "forward", "data")
    assert v["samples"] == [2]
    assert v["recording"].endswith("run.rank1.h5")
    for r in ("0", "1"):
        rank = v["ranks"][r]
        assert rank["deterministic"] is True and rank["replayed_steps"] == [4, 5], rank
        assert os.path.exists(rank["trace"]["forensics"])
        assert rank["trace"]["step"] == 5
    assert v["ranks"]["1"]["trace"]["op"] == "aten::addmm"
    assert v["ranks"]["0"]["trace"]["op"] is None
    assert "through DDP's gradient all-reduce" in v["ranks"]["0"]["trace"]["received"]


def test_a_rank_that_raises_is_named_and_its_step_replayed_on_every_rank(tmp_path: Any) -> None:
    """Issue 21, part 4: rank 1 raises a shape error at step 5; rank 0, left alone in the
    gradient all-reduce, records gloo's "connection closed by peer". Bisect names rank 1 (its
    exception is its own) and replays step 5 on both ranks: rank 1 raises again, rank 0 runs it
    without the all-reduce its peer never joins (not compared with its recorded failure)."""
    run_ranks(tmp_path, steps=8, snapshot_every=2, raise_rank=1, raise_step=5, pg_timeout=10)
    base = str(tmp_path / "run.h5")
    with open_rank_set(base) as rs:
        assert {r: rec.health()["raised"][5] for r, rec in rs.recordings.items()} == {0: 1, 1: 1}
        failure = first_bad_rank(rs)
        assert failure is not None
        assert (failure.step, failure.ranks, failure.kind) == (5, (1,), "exception")
    out = replay_cli("bisect", base, "--json")
    assert out.returncode == 0, out.stderr
    v = json.loads(out.stdout)
    assert (v["rank"], v["first_bad_step"], v["kind"]) == (1, 5, "exception")
    assert v["exception"]["type"] == "RuntimeError"
    assert "mat1 and mat2 shapes cannot be multiplied" in v["exception"]["message"]
    assert (v["op"], v["phase"]) == ("aten::addmm", "forward")
    assert v["deterministic"] is True and v["reproducible"] is True
    r0, r1 = v["ranks"]["0"], v["ranks"]["1"]
    assert r0["peer_failed_steps"] == [5] and r1["peer_failed_steps"] == []
    assert r0["replayed_steps"] == r1["replayed_steps"] == [4, 5]
    assert r0["deterministic"] and r1["deterministic"]
    assert "rank 1 raised before joining it" in r0["trace"]["received"]


def test_inf_on_one_rank_stops_every_rank_without_a_collective_of_its_own(tmp_path: Any) -> None:
    # An inf input saturates tanh: the loss stays finite, the local gradients go NaN (0 * inf).
    results = run_ranks(
        tmp_path, steps=8, nan_rank=0, nan_step=4, bad_value=float("inf"), count_steps=[2, 3]
    )
    for r in (0, 1):
        res = results[r]
        assert res["error"] == "NonFiniteLossError", results
        assert (res["step"], res["stopped_at"], res["last_step"]) == (4, 4, 4), results
        assert res["ranks"] == [0], results
        assert res["collectives"] == {"2": res["bare_collectives"], "3": res["bare_collectives"]}
    assert "on rank 0 at step 4" in results[1]["message"]
    with open_rank_set(str(tmp_path / "run.h5")) as rs:
        h0, h1 = (rs.recordings[r].health() for r in (0, 1))
        assert h0["local_grad_nonfinite"][4] == 1 and h0["loss_nonfinite"][4] == 0
        assert h1["local_grad_nonfinite"][4] == 0


def test_nonfinite_loss_with_finite_gradients_stops_every_rank_one_step_later(
    tmp_path: Any,
) -> None:
    """The loss exists only after the step's backward handed DDP its gradients: it votes at the
    next all-reduce, and every rank stops there, naming the step it went bad at."""
    results = run_ranks(tmp_path, steps=8, loss_offset_rank=1, loss_offset_step=3)
    for r in (0, 1):
        res = results[r]
        assert res["error"] == "NonFiniteLossError", results
        assert (res["step"], res["stopped_at"], res["last_step"]) == (3, 4, 4), results
        assert res["ranks"] == [1], results
    assert "on rank 1 at step 3; every rank stops at step 4" in results[0]["message"]
    with open_rank_set(str(tmp_path / "run.h5")) as rs:
        h1 = rs.recordings[1].health()
        assert h1["loss_nonfinite"][3] == 1 and h1["local_grad_nonfinite"][3] == 0
        assert (h1["param_nonfinite"][~np.isnan(h1["param_nonfinite"])] == 0).all()


def test_user_comm_hook_falls_back_to_one_extra_all_reduce_on_the_loss(tmp_path: Any) -> None:
    """DDP takes one comm hook: with the user's own, the recorder cannot see local gradients
    nor carry votes. It says so once, and the ranks agree on the loss with one extra
    all-reduce per step (the only case that pays one)."""
    results = run_ranks(tmp_path, steps=8, user_hook=True, nan_rank=1, nan_step=4, count_steps=[2])
    for r in (0, 1):
        res = results[r]
        assert [w for w in res["warnings"] if "extra all-reduce per step" in w], res
        assert len(res["warnings"]) == 1, res
        assert res["collectives"] == {"2": res["bare_collectives"] + 1}, res
        assert res["error"] == "NonFiniteLossError", results
        assert (res["step"], res["stopped_at"], res["ranks"]) == (4, 4, [1]), results


def test_a_bad_loss_at_the_last_step_is_said_at_close(tmp_path: Any) -> None:
    """No reduction follows the last step, so its loss vote is never cast: nobody stops (a rank
    raising alone would hang the others in their next collective), and the rank says so."""
    results = run_ranks(tmp_path, steps=4, loss_offset_rank=0, loss_offset_step=3)
    assert all(r["finished"] and "error" not in r for r in results.values()), results
    assert results[1]["warnings"] == []
    (said,) = results[0]["warnings"]
    assert "loss went non-finite at step 3" in said and "nobody stopped" in said


def test_under_a_grad_scaler_inf_gradients_are_a_skip_not_a_stop(tmp_path: Any) -> None:
    """AMP skips steps whose gradients overflow, by design: only the loss votes then."""
    results = run_ranks(tmp_path, steps=6, amp=True, nan_rank=1, nan_step=3, bad_value=math.inf)
    assert all(r["finished"] and "error" not in r for r in results.values()), results
    with open_rank_set(str(tmp_path / "run.h5")) as rs:
        h0, h1 = (rs.recordings[r].health() for r in (0, 1))
        assert h1["local_grad_nonfinite"][3] == 1 and h0["local_grad_nonfinite"][3] == 0
        assert h0["scaler_skipped"][3] == 1 and h1["scaler_skipped"][3] == 1


def test_four_ranks_replay_together_bitwise(tmp_path: Any) -> None:
    """With four ranks the backend's ring sums each chunk of a bucket in an order set by the
    bucket's length: the replay runs the recorder's own hook, so the last bucket carries the
    stop's votes as recorded and every rank's replay is the recording, bit for bit.
    Regression: with DDP's default hook there, rank 1's replay differed in the last bits."""
    results = run_ranks(tmp_path, steps=8, snapshot_every=3, world_size=4)
    assert all(r["finished"] for r in results.values()), results
    out = replay_cli("verify", str(tmp_path / "run.h5"), "--json")
    assert out.returncode == 0, out.stderr
    v = json.loads(out.stdout)
    assert v["deterministic"] is True
    assert sorted(v["ranks"]) == ["0", "1", "2", "3"]
    assert all(r["deterministic"] for r in v["ranks"].values())

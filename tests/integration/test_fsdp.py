"""FSDP2 (``fully_shard``) with the gloo backend on the CPU: two real processes per recording.

Each rank records only its own shard of the parameters, gradients and optimizer moments (no
gather to one rank); ``replay verify``/``bisect`` on the rank set shard ``build_fn``'s model the
same way on every rank and load each rank's shards back, and every step of every rank is the
recording bit for bit (loss, gradient norm and parameter fingerprint of the local shards).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import fsdp_worker
import numpy as np
import pytest
import torch.multiprocessing as mp

from replay.child import free_port
from replay.store import open_recording
from tests.integration.test_distributed import replay_cli

HERE = os.path.dirname(os.path.abspath(__file__))

JOIN_TIMEOUT = 90.0


def record(tmp_path: Any, **cfg: Any) -> dict[int, dict[str, Any]]:
    """Record with two FSDP2 ranks; a hang fails the test, never blocks it."""
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
        fsdp_worker.worker, args=(cfg,), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + JOIN_TIMEOUT
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"ranks still running after {JOIN_TIMEOUT:.0f} s: some rank hangs")
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(2)}


def test_fsdp2_ranks_record_their_own_shards_and_replay_together_bitwise(tmp_path: Any) -> None:
    results = record(tmp_path, steps=7, snapshot_every=2, keep_snapshots=2)
    assert all(r["finished"] for r in results.values()), results
    for r in results.values():  # said once: no DDP hook, so the stop costs one all-reduce
        assert len(r["warnings"]) == 1 and "FSDP2's fully_shard" in r["warnings"][0], r
    # The last Linear has 5 rows over 2 ranks: uneven shards.
    assert results[0]["local_shapes"]["3.weight"] == [3, 32]
    assert results[1]["local_shapes"]["3.weight"] == [2, 32]
    for r in (0, 1):
        with open_recording(str(tmp_path / f"run.rank{r}.h5")) as rec:
            fsdp = rec.meta["distributed"]["fsdp"]
            assert fsdp["kind"] == "fully_shard"
            assert fsdp["modules"] == ["", "0", "3"]
            assert fsdp["mesh"]["shape"] == [2]
            snap = rec.read_snapshot(4)  # after 4 updates: moments and weights are trained
        rows = results[r]["local_shapes"]["3.weight"][0]
        assert snap["model"]["3.weight"].shape == (rows, 32)  # this rank's shard only
        assert snap["model"]["0.weight"].shape == (16, 16)
        state = snap["optimizer"]["state"]
        moments = state.get(2, state.get("2"))
        assert moments["exp_avg"].shape == (rows, 32)
        assert np.any(moments["exp_avg"].data != 0)
        spec = {tuple(d["path"]): d for d in snap["dtensors"]}
        assert spec[("model", "3.weight")]["shape"] == [5, 32]
        assert spec[("model", "3.weight")]["placements"] == [["shard", 0]]
        assert ("optimizer", "state", 2, "exp_avg") in spec
        assert ("optimizer", "state", 2, "step") not in spec  # a plain tensor stays one

    # Each rank's grad_norm is its own shard's: together they make the step's full norm.
    shard_norms = []
    for r in (0, 1):
        with open_recording(str(tmp_path / f"run.rank{r}.h5")) as rec:
            shard_norms.append(float(rec.health()["grad_norm"][6]))
    full = math.sqrt(sum(g * g for g in shard_norms))
    assert full == pytest.approx(results[0]["full_grad_norm"], rel=1e-6)
    assert min(shard_norms) < full

    out = replay_cli("verify", str(tmp_path / "run.h5"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["deterministic"] is True
    assert report["multi_rank"]["approximate"] is False
    assert report["window"] == [4, 6]  # replayed from the snapshot of step 4, not from build_fn
    for r, summary in report["ranks"].items():
        assert summary["deterministic"] is True, (r, summary)
        assert summary["replayed_steps"] == [4, 5, 6]
    fingerprints = [s["recorded_param_fingerprint"] for s in report["steps"]]
    assert all(isinstance(f, float) for f in fingerprints)  # compared at every step

    alone = replay_cli("verify", str(tmp_path / "run.h5"), "--rank", "1", "--alone", "--json")
    assert alone.returncode != 0
    assert "FSDP2 (fully_shard) shards" in alone.stderr
    assert "replay every rank together" in alone.stderr


def test_fsdp2_bisect_names_the_rank_and_the_op_a_nan_came_from(tmp_path: Any) -> None:
    results = record(tmp_path, steps=8, snapshot_every=2, nan_rank=1, nan_step=5)
    for r in results.values():  # the ranks agree on the stop (on the loss: no DDP hook here)
        assert r["error"] == "NonFiniteLossError", r
        assert (r["step"], r["ranks"]) == (5, [1])
    out = replay_cli("bisect", str(tmp_path / "run.h5"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["first_bad_step"], report["rank"]) == (5, 1)
    assert report["deterministic"] is True
    assert (report["op"], report["phase"], report["module"]) == ("aten::addmm", "forward", "0")
    assert report["cause"] == "data"
    peer = report["ranks"]["0"]["trace"]
    assert "FSDP2's gradient reduce-scatter" in peer["received"]


def test_fsdp2_mixed_precision_and_pending_sharded_gradients_replay_bitwise(
    tmp_path: Any,
) -> None:
    """bfloat16 compute, float32 reduction: the replay must apply the same policy to be exact.
    Gradients accumulate over two steps: the snapshots (before even steps) hold the shards of
    the gradients still pending, and the replay starts from them."""
    cfg = {"steps": 7, "snapshot_every": 2, "keep_snapshots": 2}
    results = record(tmp_path, **cfg, bf16=True, accumulate=True)
    assert all(r["finished"] for r in results.values()), results
    with open_recording(str(tmp_path / "run.rank1.h5")) as rec:
        policies = rec.meta["distributed"]["fsdp"]["mp_policy"]
        snap = rec.read_snapshot(4)
    assert snap["grads"]["3.weight"].shape == (2, 32)  # rank 1's shard of the pending gradient
    assert ["grads", "3.weight"] in [d["path"] for d in snap["dtensors"]]
    want = {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": None}
    assert sorted(policies) == ["", "0", "3"]
    assert all({k: p[k] for k in want} == want for p in policies.values())
    out = replay_cli("verify", str(tmp_path / "run.h5"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["deterministic"] is True
    assert report["window"] == [4, 6]
    assert all(s["deterministic"] for s in report["ranks"].values())

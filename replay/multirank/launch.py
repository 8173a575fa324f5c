"""Replaying every rank of a DDP run together: one process per rank, real collectives.

Replaying one rank alone updates its parameters with its own gradients instead of the
all-reduced average, so from the first step after a snapshot it is no longer the run. Here each
rank gets a process (``python -m replay.workflows.rank_worker``, started with the environment
torchrun gives: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), a
process group of the recorded world size (gloo; NCCL when the run used it and this machine has
a GPU per rank), its own snapshot, RNG states and batches, and the model in
``DistributedDataParallel``. The workflow runs on one rank, the leader, and the others follow
it call by call (``lockstep.py``), so the replay is the recording on every rank, bit for bit,
and each rank checks that against its own file.

A rank that fails or hangs never hangs the caller: the process group has a timeout, the whole
set has a deadline, and the first rank that exits with an error ends the others; the error is
one line naming the rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..bisect import NonFinite, Predicate, Raised
from ..child import RANK_WORKER, free_port, python_module
from ..errors import RecordingError, ReplayError, UsageError, error_of_exit_code
from ..limits import env_number
from ..ranks.scan import RankScan
from ..reports.ranks import MultiRankRun, RankFailure, RankReplay
from ..store.tmpdirs import private_dir

__all__ = ["replay_rank_set", "DEADLINE"]

DEADLINE = 900.0  # seconds for the whole replay; REPLAY_RANKS_TIMEOUT overrides
PG_TIMEOUT = 300.0  # seconds a rank waits in a collective; REPLAY_PG_TIMEOUT overrides


def _backend(recorded: str | None, world: int) -> str:
    """NCCL where the run used it and this machine has a GPU per rank, gloo otherwise."""
    if recorded == "nccl":
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() >= world:
            return "nccl"
    return "gloo"


def _criterion_spec(criterion: Any) -> dict[str, Any] | None:
    if criterion is None:
        return None
    if isinstance(criterion, Predicate):
        return {"until": criterion.expr.text}
    if isinstance(criterion, (NonFinite, Raised)):
        return {"kind": criterion.kind}
    raise UsageError(f"a multi-rank replay cannot pass the criterion {criterion!r} to its ranks")


def _kill(procs: dict[int, subprocess.Popen[bytes]]) -> None:
    for p in procs.values():
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the rank and anything it started
    for p in procs.values():
        p.wait()


def _failure(rank: int, tmp: str, code: int | None) -> ReplayError:
    try:
        res = json.loads(Path(tmp, f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        res = None
    if res is not None and not res.get("ok"):
        return error_of_exit_code(
            int(res.get("exit_code") or 5), f"rank {rank}: {res.get('error')}"
        )
    try:  # the last lines its stderr holds
        said = Path(tmp, f"rank{rank}.err").read_text(errors="replace").splitlines()
    except OSError:
        said = []
    why = " | ".join([ln.rstrip() for ln in said if ln.strip()][-3:])
    return ReplayError(
        f"rank {rank}'s replay process exited with code {code}" + (f" ({why})" if why else "")
    )


def _run_ranks(
    paths: dict[int, str], spec: dict[str, Any], tmp: str, log: Callable[[str], None] | None
) -> dict[int, dict[str, Any]]:
    world = len(paths)
    spec = {**spec, "files": {str(r): p for r, p in paths.items()}, "out": tmp}
    spec_path = os.path.join(tmp, "spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    port = free_port()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    deadline = time.monotonic() + env_number("REPLAY_RANKS_TIMEOUT", DEADLINE)
    try:
        for r in sorted(paths):
            env = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(r),
            }
            with (
                open(os.path.join(tmp, f"rank{r}.out"), "wb") as out,
                open(os.path.join(tmp, f"rank{r}.err"), "wb") as err,
            ):
                procs[r] = subprocess.Popen(
                    python_module(RANK_WORKER, spec_path),
                    env=env,
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group: killed as one
                )
        if log is not None:
            log(
                f"replaying {world} ranks together ({spec['backend']}, leader rank {spec['leader']})"
            )
        while True:
            codes = {r: p.poll() for r, p in procs.items()}
            bad = [r for r, c in codes.items() if c not in (None, 0)]
            if bad:
                # Name a rank's own error before a follower's "the leader failed".
                errors = {r: _failure(r, tmp, codes[r]) for r in bad}
                own = [r for r in bad if "(leading the replay)" not in str(errors[r])]
                raise errors[(own or bad)[0]]
            if all(c == 0 for c in codes.values()):
                break
            if time.monotonic() > deadline:
                waiting = [r for r, c in codes.items() if c is None]
                raise ReplayError(
                    f"the multi-rank replay did not finish in time (ranks {waiting} still "
                    "running: a rank waits in a collective its peers never joined); set "
                    "REPLAY_RANKS_TIMEOUT for a longer run, or replay one rank with --rank N --alone"
                )
            time.sleep(0.05)
    except BaseException:  # (a rank failed, the deadline passed, an interrupt): end them all
        _kill(procs)
        raise
    # What the leader said (the engine's notes and warnings: a changed entry file...) is what
    # a single-process replay would have printed; the followers say the same for their ranks.
    said = Path(tmp, f"rank{spec['leader']}.err").read_text(errors="replace")
    if said.strip():
        sys.stderr.write(said if said.endswith("\n") else said + "\n")
        sys.stderr.flush()
    return {r: json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in sorted(paths)}


def replay_rank_set(
    scan: RankScan,
    mode: str,
    *,
    criterion: Any = None,
    trace: bool = True,
    device: str | None = None,
    entry: str | None = None,
    trust: bool = False,
    reenter: bool = False,
    log: Callable[[str], None] | None = None,
    **job: Any,
) -> dict[str, Any]:
    """``replay verify``, ``bisect``, ``trace``, ``export`` or ``whatif`` (``mode``) of every rank
    of the rank set ``scan`` (:func:`replay.ranks.scan.rank_set`).

    Returns the leader's report (rank 0, or for ``bisect``, ``whatif`` and ``trace`` of that
    step the rank whose own values went bad first), with ``ranks``: every rank's own bitwise check (``deterministic``,
    ``divergence``, ``replayed_steps``), and ``deterministic`` true only when every rank's is.
    ``job``: the mode's own arguments (``step``, ``out``, ``changes``...), passed to each rank.
    ``export`` and ``whatif`` run their workflow on every rank (each writes or changes its own
    state); the others run it on the leader, which every other rank follows.
    """
    scan.check()
    scan.check_one_run(trust or entry is not None)
    paths, world = scan.paths, scan.world_size
    backends = {f.backend for f in scan.ranks.values()}
    first = scan.first_bad
    # The rank that leads: bisect's culprit, or trace's when it traces the culprit's step.
    leads = mode in ("bisect", "whatif") or (
        mode == "trace" and first is not None and job.get("step") == first.step
    )
    failure = first if leads else None
    sharded = any(f.fsdp for f in scan.ranks.values())
    if world is None or world != len(paths):
        raise RecordingError(f"{scan.spec}: the files do not say the run's world size")
    leader = failure.rank if failure is not None else min(paths)
    recorded_backend = next(iter(backends)) if len(backends) == 1 else None
    job = {
        **job,
        "mode": mode,
        "leader": leader,
        "backend": _backend(recorded_backend, world),
        "timeout": env_number("REPLAY_PG_TIMEOUT", PG_TIMEOUT),
        "device": device,
        "entry": entry,
        "trust": trust,
        "reenter": reenter,
        "trace": trace,
        "criterion": _criterion_spec(criterion),
        "first_bad": None if scan.first_bad is None else scan.first_bad.step,
    }
    tmp = private_dir("ranks")
    try:
        results = _run_ranks(paths, job, tmp, log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report: dict[str, Any] = dict(results[leader]["report"])
    ranks = {r: RankReplay.from_json(results[r]["replay"]) for r in sorted(results)}
    every = all(s.deterministic for s in ranks.values())
    report["deterministic"] = bool(report.get("deterministic", True)) and every
    if mode in ("bisect", "trace"):
        if report.get("reproducible") is not None:
            report["reproducible"] = bool(report["reproducible"]) and every
        report["rank"] = leader
    if mode != "verify":
        report["rank_set"] = scan.culprit_file(leader)[1].to_json()
    reduction = "FSDP2's gradient reduce-scatter" if sharded else "DDP's gradient all-reduce"
    if failure is not None:
        ranks = {r: _received(s, failure, leader, reduction) for r, s in ranks.items()}
    report["multi_rank"] = MultiRankRun(world, job["backend"], leader).to_json()
    report["ranks"] = {str(r): s.to_json() for r, s in ranks.items()}
    return report


def _received(s: RankReplay, failure: RankFailure, leader: int, reduction: str) -> RankReplay:
    """Rank ``s``, its trace saying what reached it from the culprit ``leader`` when it named
    no op of its own."""
    tr, r, step = s.trace, s.rank, failure.step
    if tr is None or r in failure.ranks or tr.get("op") is not None:
        return s
    if step in s.peer_failed_steps:
        why = (
            f"rank {r}'s gradient all-reduce at step {step} failed in the recording because "
            f"rank {leader} raised before joining it; replayed without the all-reduce (not "
            "compared with the recording)"
        )
    elif failure.kind == "nonfinite":
        why = (
            f"rank {r}'s own values stayed finite at step {step}; what went non-finite reached "
            f"it from rank {leader} through {reduction}"
        )
    else:
        return s
    return replace(s, trace={**tr, "received": why})

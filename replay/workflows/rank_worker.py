"""One rank of a multi-rank replay: ``python -m replay.workflows.rank_worker SPEC.json``.

Started by :func:`replay.multirank.launch.replay_rank_set` the way torchrun starts
ranks (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``). It joins a
process group of the recorded world size (or, replaying by re-entry, runs the recorded program
again, which makes the process group and its DDP wrapper itself), opens its own rank file, wraps
the model ``build_fn`` makes in ``DistributedDataParallel`` as the recorded loop did (or shards it with FSDP2's
``fully_shard``, when ``meta.distributed.fsdp`` says the loop did), and replays in lockstep with the
other ranks (``replay/multirank/lockstep.py``): the leader runs the workflow, the others follow. It writes
``rank<r>.json`` into the spec's ``out`` directory: its report, or its error in one line.

SPEC holds ``mode`` (``verify``, ``bisect``, ``trace``, ``export`` or ``whatif``), ``files`` (rank -> path), ``leader``,
``out``, ``backend``, ``timeout`` (seconds, the process group's), ``device``, ``entry``,
``trust``, ``trace`` and ``criterion`` (bisect: ``null``, ``{"kind": ...}`` or
``{"until": EXPR}``); ``step`` (trace, export), ``export_dir`` and ``shown_out`` (export),
``changes``, ``from_step`` and ``to_step`` (whatif), ``first_bad`` (the set's first bad step).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
import traceback
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..bisect.criteria import criterion_named
from ..capture.sharded import mesh_of, shard_like
from ..engine import Engine
from ..errors import EXIT_USAGE, ReplayError, exit_code_of, first_line
from ..jsonsafe import json_safe
from ..multirank.lockstep import Leader, StepLog, follow, rank_summary, run_own_step
from ..ranks.ddp_hook import LocalGradProbe
from ..ranks.first_bad import is_collective_error
from ..reports.divergence import Divergence
from ..reports.ranks import RankReplay
from ..store import open_recording
from ..store.reader import Recording, Window
from ..trace import trace_step
from .bisect import bisect_engine
from .export import export_work
from .session import ReplayOptions, with_engine
from .trace import trace_engine
from .verify import verify_engine
from .whatif import parse_change, replay_range, whatif_work

__all__ = ["main"]


def _wrap_ddp(engine: Engine, rec: Recording) -> set[int]:
    """The model in ``DistributedDataParallel``, as the recorded loop had it.

    The recorder's per-rank gradient probe (``local_grad_norm``) averaged the buckets as DDP's
    default all-reduce hook does and, with the rank-consistent stop on, carried the ranks'
    votes in the last bucket's all-reduce (``replay/ranks/ddp_hook.py``, which the recorder uses). Where the recording
    shows the probe, the replay runs that same hook: the buckets that meet in each all-reduce
    then have the recorded lengths, and with three or more ranks the backend sums every
    element in the recorded order (a longer bucket moves the chunks a ring all-reduce sums).
    """
    ids = [engine.device] if engine.device.startswith("cuda") else None
    ddp = engine.wrapper  # a re-run program's own wrapper
    if not isinstance(ddp, DistributedDataParallel):
        ddp = DistributedDataParallel(engine.model, device_ids=ids)
    h = rec.health()
    probed = "local_grad_norm" in h and any(not math.isnan(float(x)) for x in h["local_grad_norm"])
    if probed:
        dist_meta = rec.meta.get("distributed") or {}
        why = LocalGradProbe(
            ddp,
            engine.objs.trained_params(),
            rank=int(dist_meta.get("rank", 0)),
            world_size=int(dist_meta.get("world_size", 1)),
            votes=bool((rec.meta.get("config") or {}).get("raise_on_nonfinite", True)),
        ).install()
        if why is not None:
            raise ReplayError(f"the recorded DDP communication hook cannot be installed: {why}")
    engine.use_wrapper(ddp)
    peer_failed = peer_failed_steps(engine)
    if peer_failed:
        # This rank's all-reduce at those steps failed because a peer raised before joining
        # it; replayed, the peer raises again and never joins: run them without the all-reduce.
        engine.around_step = lambda t: ddp.no_sync() if t in peer_failed else nullcontext()
    return peer_failed


def _shard(engine: Engine, spec: dict[str, Any]) -> set[int]:
    """The model sharded with FSDP2's ``fully_shard`` as the recorded loop had it
    (``meta.distributed.fsdp``), its optimizer over the sharded parameters; each rank then
    loads its own shards from its own snapshot. Its collectives (all-gather in the forward,
    reduce-scatter in the backward) run in the step itself, on every rank in lockstep."""
    engine.shard_model(lambda model: shard_like(model, spec, engine.device))
    # A peer that raised before joining a collective: replaying the step without the
    # collective is DDP's no_sync; FSDP2 all-gathers the parameters in the forward, so there
    # is no such step here (the rank that raised is still named by the replay's failure).
    return set()


def peer_failed_steps(engine: Engine) -> set[int]:
    """Steps at which this rank recorded a collective error (a peer failed), not its own."""
    out = set()
    for row in engine.recorded_rows():
        t = int(row["step"])
        if row.get("raised") == 1.0 and t in engine.window:
            try:
                exc = engine.recorded_exception(t)
            except ReplayError:
                continue
            if is_collective_error(exc):
                out.add(t)
    return out


def _same_windows(engine: Engine, group: Any, world: int) -> None:
    """Every rank replays the same steps: the steps every rank's window holds, from a snapshot
    every rank has. A rank that died outside any step recorded fewer steps than its peers
    (whose next step failed in a collective without it): the steps they all completed are the
    ones replayed together. ``ReplayError`` when no such steps exist."""
    w = engine.window
    every: list[Any] = [None] * world
    dist.all_gather_object(every, (w.first, w.last, list(w.snapshots)), group=group)
    first, last = max(x[0] for x in every), min(x[1] for x in every)
    common = set(every[0][2]).intersection(*(x[2] for x in every[1:]))
    snapshots = tuple(sorted(s for s in common if first <= s <= last))
    if first > last or first not in snapshots:
        shown = "; ".join(f"rank {r}: steps {x[0]}..{x[1]}" for r, x in enumerate(every))
        raise ReplayError(
            f"the ranks' replayable windows differ ({shown}): the ranks cannot replay the same "
            "steps together; replay one rank alone with --rank N --alone"
        )
    if (first, last, snapshots) != (w.first, w.last, w.snapshots):
        engine.window = Window(first, last, snapshots)


def _lead(engine: Engine, rec: Recording, spec: dict[str, Any]) -> dict[str, Any]:
    """The leader's workflow, the one a single-process replay runs, on this rank's engine."""
    mode = spec["mode"]
    if mode == "verify":
        start, every = spec.get("start"), bool(spec.get("every_step"))
        return verify_engine(rec, engine, start=start, every_step=every).to_json()
    if mode == "trace":
        return trace_engine(rec, engine, rec.path, spec.get("step")).to_json()
    criterion = criterion_named(**spec["criterion"]) if spec.get("criterion") else None
    trace = bool(spec.get("trace", True))
    return bisect_engine(
        rec, engine, criterion, trace=trace, reraise=(ReplayError,), together=True
    ).to_json()


def _export(
    engine: Engine, rec: Recording, spec: dict[str, Any], rank: int, group: Any
) -> dict[str, Any]:
    """This rank's state before the step, into ``rank<r>/`` of the staged export folder."""
    out = os.path.join(spec["export_dir"], f"rank{rank}")
    shown = os.path.join(spec["shown_out"], f"rank{rank}")
    work = export_work(
        rec.path, out, spec.get("step"), first_bad=spec.get("first_bad"), shown=shown
    )
    return work(rec, engine).to_json()


def _whatif(
    engine: Engine, rec: Recording, spec: dict[str, Any], rank: int, group: Any
) -> dict[str, Any]:
    """The experiments on this rank, with the same changes as on every other rank, over the
    steps the leader chose (each rank's own default range follows from its own health, which
    may show the failure a step later than the leader's)."""
    changes = [parse_change(kind, arg) for kind, arg in spec["changes"]]
    lo, hi = spec.get("from_step"), spec.get("to_step")
    leader = int(spec["leader"])
    box: list[Any] = [replay_range(engine, lo, hi) if rank == leader else None]
    dist.broadcast_object_list(box, src=leader, group=group)
    if rank != leader:  # (the leader keeps its defaults, and the notes that explain them)
        lo, hi = box[0]
    return whatif_work(rec.path, changes, lo, hi)(rec, engine).to_json()


_EVERY_RANK = {"export": _export, "whatif": _whatif}

_TRACE_KEYS = ("cause", "op", "phase", "module", "source", "made", "forensics")


def _tracer(engine: Engine, rec: Recording, traced: dict[str, Any]) -> Any:
    """A follower's answer to the leader tracing its culprit step: trace its own step the same
    way, into its own forensics sidecar (``replay tui`` shows every rank's). Only the first
    call is traced (the leader's later ones probe sliced batches)."""

    def on_call(t: int) -> None:
        if traced:
            run_own_step(engine, t)
            return
        result = trace_step(
            engine.model,
            engine.optimizer,
            engine.step_callable(t),
            engine.batch(t),
            scaler=engine.scaler,
        )
        result.write(rec.forensics_path, run_id=rec.run_id, step=t)
        v = result.verdict
        traced.update(json_safe({k: v.get(k) for k in (*_TRACE_KEYS, "kind", "notes") if k in v}))
        traced.update(step=t, forensics=rec.forensics_name)

    return on_call


def _reenters(path: str, spec: dict[str, Any]) -> bool:
    """Whether this rank's replay runs the recorded program again (it then makes the process
    group itself, as it did when it trained) rather than importing ``build_fn``."""
    if spec.get("entry"):
        return False
    if spec.get("reenter"):
        return True
    with open_recording(path) as rec:
        return "build_fn" not in rec.entry


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Replay this rank (``RANK`` in the environment); returns what ``rank<r>.json`` holds."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    backend = spec.get("backend") or "gloo"
    device = spec.get("device")
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = device or f"cuda:{local}"
    timeout = datetime.timedelta(seconds=float(spec.get("timeout") or 300))
    path = spec["files"][str(rank)]
    reenter = _reenters(path, spec)
    if not reenter:  # re-entry: the program makes its process group, from this environment
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    try:
        return with_engine(
            path,
            lambda rec, engine: _replay_rank(rec, engine, spec, rank, world, timeout),
            ReplayOptions(device, spec.get("entry"), bool(spec.get("trust")), reenter),
        )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _replay_rank(
    rec: Recording, engine: Engine, spec: dict[str, Any], rank: int, world: int, timeout: Any
) -> dict[str, Any]:
    if not dist.is_initialized():
        raise ReplayError(
            "the recorded program reached its Recorder without a process group "
            "(torch.distributed.init_process_group): it cannot be replayed as a rank set"
        )
    leader = int(spec["leader"])
    # Commands travel on their own gloo group (CPU objects, also when the model uses NCCL).
    group = dist.new_group(backend="gloo", timeout=timeout)
    _same_windows(engine, group, world)
    fsdp = (rec.meta.get("distributed") or {}).get("fsdp")
    if fsdp:
        # (a re-run program sharded its model itself)
        peer_failed = set() if mesh_of(engine.model) is not None else _shard(engine, fsdp)
    else:
        peer_failed = _wrap_ddp(engine, rec)
    # Not compared on this rank: the recording holds the collective's failure.
    engine.not_compared |= peer_failed
    log = StepLog()
    log.attach(engine, rank)
    report: dict[str, Any] | None = None
    traced: dict[str, Any] = {}  # a follower's own trace of the culprit step
    mode = spec["mode"]
    own: dict[str, Any] = {}  # export, whatif: this rank's own report
    if mode in _EVERY_RANK:
        # Every rank runs the workflow on its own engine: the engine's calls depend only on
        # the workflow's arguments and the window (the same on every rank), never on values.
        own = _EVERY_RANK[mode](engine, rec, spec, rank, group)
        report = own if rank == leader else None
    elif rank == leader:
        lead = Leader(engine, rank, group)
        lead.install()
        try:
            report = _lead(engine, rec, spec)
        except BaseException as e:
            lead.finish(f"{type(e).__name__}: {first_line(e)}")
            raise
        lead.finish()
    else:
        tracing = mode == "trace" or (mode == "bisect" and spec.get("trace", True))
        on_call = _tracer(engine, rec, traced) if tracing else None
        follow(engine, leader, group, on_call)
    if mode == "whatif":  # its experiments change the steps on purpose: its baseline is checked
        div = Divergence.from_json(own["divergence"])
        summary = RankReplay(rank=rank, recording=rec.path, deterministic=bool(own["reproduces"]))
        summary = replace(summary, divergence=div, removed_by=list(own["removed_by"]))
    else:
        summary = rank_summary(engine, log, rank)
    trace: dict[str, Any] | None = traced or None
    if rank == leader and report is not None and report.get("forensics"):
        trace = {k: report.get(k) for k in _TRACE_KEYS}
        trace.update(step=report.get("first_bad_step", report.get("step")), kind=report.get("kind"))
    summary = replace(
        summary,
        export=own if mode == "export" else None,
        peer_failed_steps=sorted(peer_failed),
        trace=trace,
    )
    return {
        "rank": rank,
        "ok": True,
        "leader": rank == leader,
        "report": report,
        "replay": summary.to_json(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # (started by multirank/launch.py with the spec it wrote: anything else is misuse)
        with open(argv[0]) as fh:
            spec = json.load(fh)
    except (IndexError, OSError, ValueError) as e:
        why = "no spec given" if isinstance(e, IndexError) else f"{type(e).__name__}: {e}"
        print(f"replay: error: rank worker: usage: SPEC.json ({why})", file=sys.stderr)
        return EXIT_USAGE
    rank = int(os.environ.get("RANK", "-1"))
    out = os.path.join(spec["out"], f"rank{rank}.json")
    try:
        result = run(spec)
        code = 0
    except ReplayError as e:
        result, code = {"rank": rank, "ok": False, "error": str(e), "exit_code": exit_code_of(e)}, 1
    except Exception as e:  # noqa: BLE001 - one line for the parent, the traceback on stderr
        traceback.print_exc()
        result = {"rank": rank, "ok": False, "error": f"{type(e).__name__}: {first_line(e)}"}
        result["exit_code"], code = exit_code_of(e), 1
    with open(out + ".tmp", "w") as fh:
        json.dump(json_safe(result), fh)
    os.replace(out + ".tmp", out)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""``replay info RUN.h5``: what a recording holds. Reads the store only (no torch)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from ..capture.environ import differs_here
from ..errors import EXIT_BAD_RECORDING, EXIT_INCOMPLETE_RANKS, EXIT_OK, RecordingError
from ..ranks.scan import rank_set, spans
from ..ranks.summary import summarise
from ..safetext import term_safe, term_safe_tree
from ..store import open_recording
from ..store.hparams import step_hparams
from ..store.liveness import writer_state
from ..store.reader import claimed_size
from ..store.segments import segment_files

if TYPE_CHECKING:
    from ..store.reader import Recording

__all__ = ["info", "describe"]


def _steps_summary(rec: Recording) -> dict[str, Any]:
    steps = rec.steps()
    h = rec.health()
    window = rec.replayable_window()
    status = rec.status()
    losses = h["loss"][np.isfinite(h["loss"])]
    return {
        "steps_recorded": int(status["steps_total"])
        if status["steps_total"]
        else int(len(h["step"])),
        "health_steps": [int(h["step"][0]), int(h["step"][-1])] if len(h["step"]) else None,
        "batch_steps": [int(steps[0]), int(steps[-1])] if len(steps) else None,
        "batch_count": int(len(steps)),
        "snapshots": [int(s) for s in rec.snapshot_steps()],
        "replayable_window": [window.first, window.last] if window else None,
        "reach": rec.reach(),
        "not_replayable": rec.run_meta.not_replayable,
        "first_bad": rec.first_bad(),
        "last_loss": float(losses[-1]) if losses.size else None,
        "closed_cleanly": bool(status["closed"]),
        "writer": _writer(rec.path),
        "truncated": None,
        "damaged_steps": rec.damaged_steps(),
        "damaged_health": sorted(rec.damaged_health),
        "self_check": _self_check(rec.path, rec.run_id),
        # The other segments of this recording: a resumed run records beside it (run.1.h5)
        "segments": [_segment(f) for f in segment_files(rec.path)],
        "watched_objects": rec.watched_objects,
        "hparams": _hparams(rec, steps),
    }


def _hparams(rec: Recording, steps: np.ndarray) -> dict[str, Any] | None:
    """Every optimizer's numeric hyper-parameters, per param group, at the newest step kept
    (``None`` without an optimizer or a readable step record)."""
    if not len(steps):
        return None
    try:
        values = step_hparams(rec, int(steps[-1]))
    except (KeyError, RecordingError):
        return None
    return {"step": int(steps[-1]), "optimizers": values} if values else None


def _self_check(path: str, run_id: str) -> dict[str, Any] | None:
    """The background self-check's verdict beside the file (docs/selfcheck.md), with its line."""
    from ..store.selfcheck import read_selfcheck

    v = read_selfcheck(path, run_id)
    return None if v is None else {**v.to_json(), "line": v.line()}


def _segment(path: str) -> dict[str, Any]:
    """One other segment: its file and the steps its health holds (``None`` when it cannot
    be read: it is only named)."""
    try:
        with open_recording(path) as other:
            h = other.health()
            steps = [int(h["step"][0]), int(h["step"][-1])] if len(h["step"]) else None
    except RecordingError:
        steps = None
    return {"path": path, "health_steps": steps}


def _writer(path: str) -> dict[str, Any] | None:
    """The live writer of the file, from its lock: still recording, or draining after its
    training died (with the steps it still has to commit)."""
    state = writer_state(path)
    if state is None:
        return None
    return {
        "draining": state.draining,
        "steps_to_come": state.steps_to_come,
        "pid": state.pid,
        "writer_pid": state.writer_pid,
    }


def _trust(rec: Recording) -> dict[str, str]:
    """Whether the replaying commands would run this recording's code (docs/trust.md): read
    only, no key is made."""
    from ..trust import standing

    try:
        got = standing(rec.meta, rec.sources, rec.run_id, rec.format_version)
    except RecordingError as e:  # its sources unreadable: shown, and never run
        return {"standing": "foreign", "why": str(e), "line": f"foreign ({e})"}
    return {"standing": got.kind, "why": got.why, "line": got.words()}


def _bitwise_cuda(env: Any) -> dict[str, Any] | None:
    """Whether a CUDA run can replay bitwise, as its recorded settings say; None for a run
    with no GPU (``store/bitwise.py``)."""
    from ..store.bitwise import cuda_blockers

    if not isinstance(env, dict) or not env.get("devices"):
        return None
    why = cuda_blockers(env)
    return {"possible": not why, "why_not": why}


def describe(path: str) -> dict[str, Any]:
    """Everything ``replay info`` shows, as a JSON-able dict."""
    with open_recording(path) as rec:
        out = {
            "path": path,
            "format": "replay-recording",
            "format_version": rec.format_version,
            "run_id": rec.run_id,
            "created": rec.created,
            **_steps_summary(rec),
            "config": rec.config,
            "entry": rec.entry,
            "program": rec.program,
            "env": rec.env,
            "bitwise_cuda": _bitwise_cuda(rec.env),
            # the recorded run's variables that differ here (null: cannot be told)
            "environ_here": differs_here(rec.env.get("environ")),
            "model": {
                k: v for k, v in rec.meta.get("model", {}).items() if k in ("class", "param_bytes")
            },
            "optimizer": rec.meta.get("optimizer"),
            "scheduler": rec.meta.get("scheduler"),
            "scaler": rec.meta.get("scaler"),
            "objects": rec.meta.get("objects"),
            "distributed": rec.meta.get("distributed"),
            "trust": _trust(rec),
        }
        out["model"]["n_params"] = sum(p.numel for p in rec.run_meta.model.params)
    out["truncated"] = _truncated(path, out["writer"])
    return out


def _truncated(path: str, writer: dict[str, Any] | None) -> dict[str, int] | None:
    """``{"size", "claimed"}`` when the file ends before the end its HDF5 superblock claims (a
    cut copy, a disk that filled up): the status dataset may still say "closed cleanly", and
    what lies past the cut is gone. A file still being written is not judged (it grows)."""
    if writer is not None:
        return None
    extent = claimed_size(path)
    if extent is None or extent[0] >= extent[1]:
        return None
    return {"size": extent[0], "claimed": extent[1]}


def _reach_line(r: dict[str, Any]) -> str:
    """``any step of the last 10,000 (snapshots every 50 steps for the last 150, ...)``."""
    from ..store.retention import describe_tiers

    return (
        f"any step of the last {r['reach']:,} (snapshots {describe_tiers(r['tiers'])}; "
        f"{r['step_slots']:,} steps kept)"
    )


def _steps_list(steps: list[int], most: int = 12) -> str:
    return ", ".join(map(str, steps[:most])) + (
        f" (+{len(steps) - most} more)" if len(steps) > most else ""
    )


def _fmt_range(r: list[int] | None) -> str:
    return f"steps {r[0]}..{r[1]}" if r else "none"


def render(d: dict[str, Any]) -> str:
    d = term_safe_tree(d)  # every string here came from the file: see replay/safetext.py
    lines = [
        f"{d['path']}  (replay recording, format v{d['format_version']}, run {d['run_id'][:8]})"
    ]
    w = d.get("writer")
    cut = d.get("truncated")
    if cut:
        state = (
            f"TRUNCATED: the file holds {cut['size']} of the {cut['claimed']} bytes it claims "
            f"({100 * cut['size'] // max(cut['claimed'], 1)}%); what is still readable is below"
        )
    elif d["closed_cleanly"]:
        state = "closed cleanly"
    elif w and w["draining"]:
        more = f": {w['steps_to_come']} steps to come" if w["steps_to_come"] is not None else ""
        state = f"not closed: its training died, its writer is still committing{more}"
    elif w:
        state = f"being written (training process {w['pid']})"
    else:
        state = "not closed (its training or its writer died)"
    lines.append(f"  status          {state}")
    if d.get("trust"):
        lines.append(f"  trust           {d['trust']['line']}")
    lines.append(
        f"  steps recorded  {d['steps_recorded']}  (health for {_fmt_range(d['health_steps'])})"
    )
    kept = d["batch_steps"]
    gaps = ""
    if kept and d.get("batch_count", 0) < kept[1] - kept[0] + 1:
        # a commit cut short (a writer killed, a full disk) rewrites the ring in parts
        gaps = f"  ({d['batch_count']} of them: a commit was cut short)"
    lines.append(f"  batches kept    {_fmt_range(kept)}{gaps}")
    snaps = d["snapshots"]
    lines.append(f"  snapshots       {', '.join(map(str, snaps)) if snaps else 'none'}")
    w = d["replayable_window"]
    nothing = (
        f"nothing: recorded without replay ({d['not_replayable']})"
        if d.get("not_replayable")
        else "nothing (no kept snapshot with its batches)"
    )
    lines.append(f"  replayable      {_fmt_range(w) if w else nothing}")
    if d.get("reach") and not d.get("not_replayable"):
        lines.append(f"  reach           {_reach_line(d['reach'])}")
    check = d.get("self_check")
    if check:
        lines.append(f"  self-check      {check['line']}")
    if d.get("damaged_steps") or d.get("damaged_health"):
        parts = []
        if d.get("damaged_steps"):
            parts.append(f"step records {_steps_list(d['damaged_steps'])}")
        if d.get("damaged_health"):
            parts.append(f"health rows {_steps_list(d['damaged_health'])}")
        lines.append(
            f"  DAMAGED         {'; '.join(parts)}: their bytes fail their checksums, so they "
            "are treated as missing (never replayed)"
        )
    for seg in d.get("segments") or []:
        where = _fmt_range(seg["health_steps"]) if seg["health_steps"] else "unreadable"
        lines.append(f"  other segment   {seg['path']} ({where})")
    fb = d["first_bad"]
    bad = []
    if fb["nonfinite"] is not None:
        bad.append(f"first non-finite at step {fb['nonfinite']}")
    if fb["exception"] is not None:
        bad.append(f"exception at step {fb['exception']}")
    lines.append(
        f"  health          {'; '.join(bad) if bad else 'no NaN/Inf or exception recorded'}"
    )
    if d["last_loss"] is not None:
        lines.append(f"  last finite loss {d['last_loss']:.6g}")
    m = d["model"]
    lines.append(f"  model           {m.get('class')}  ({m.get('n_params', 0):,} parameters)")
    opt = (d.get("optimizer") or {}).get("class")
    sch = (d.get("scheduler") or {}) or {}
    lines.append(
        f"  optimizer       {opt or 'none (the step updates the parameters itself)'}"
        + (f", scheduler {sch.get('class')}" if sch else "")
        + (", GradScaler" if d.get("scaler") else "")
    )
    hp: dict[str, Any] = d.get("hparams") or {}
    for name, groups in (hp.get("optimizers") or {}).items():
        for i, g in enumerate(groups):
            said = ", ".join(f"{k} {v:.6g}" for k, v in g.items()) or "no numbers"
            lines.append(f"  hyper-params    {name} group {i} at step {hp['step']}: {said}")
    extra = (d.get("objects") or {}).get("stateful") or []
    if extra:
        lines.append(f"  also kept       {', '.join(map(str, extra))} (named objects)")
    for role, e in d["entry"].items():
        lines.append(f"  {role:<15} {e['module']}:{e['qualname']}  ({e['path']})")
    env = d["env"]
    lines.append(
        f"  environment     python {env.get('python')}, torch {env.get('torch')}, "
        f"{'CUDA ' + str(env.get('cuda')) + ' on ' + ', '.join(env.get('devices') or []) if env.get('devices') else 'CPU'}, "
        f"{env.get('num_threads')} threads, host {env.get('hostname')}"
    )
    bitwise = d.get("bitwise_cuda")
    if bitwise:
        said = (
            "possible" if bitwise["possible"] else "NOT possible: " + "; ".join(bitwise["why_not"])
        )
        lines.append(f"  bitwise CUDA    {said}")
    kept = (env.get("environ") or {}).get("digests")
    here = d.get("environ_here")
    if isinstance(kept, dict) and here is not None:
        said = f"differ here: {', '.join(here)}" if here else "the same here"
        lines.append(f"  variables       {len(kept)} kept as keyed digests, {said}")
    if env.get("git_commit"):
        lines.append(f"  git commit      {env['git_commit']}")
    started = env.get("started")
    if started:
        lines.append(
            f"  started         {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}"
        )
    if d.get("distributed"):
        dd = d["distributed"]
        lines.append(
            f"  distributed     rank {dd.get('rank')} of {dd.get('world_size')} ({dd.get('backend')})"
        )
    return "\n".join(lines)


def render_rank_set(d: dict[str, Any]) -> str:
    d = term_safe_tree(d)
    ranks = d["ranks"]
    lines = [f"{d['rank_set']}  (rank set of {d['world_size'] or len(ranks)})"]
    if d["missing_ranks"]:
        lines.append(f"  missing ranks   {spans(d['missing_ranks'])}")
    for r, why in list(d["damaged_ranks"].items())[:20]:
        lines.append(f"  DAMAGED         rank {r}: {why}")
    if len(d["damaged_ranks"]) > 20:
        lines.append(f"  DAMAGED         ... ({len(d['damaged_ranks']) - 20} more ranks)")
    lines.append(
        f"  {'rank':>4}  {'steps':>11}  {'replayable':>11}  {'last loss':>10}  status / health"
    )
    for r, x in ranks.items():
        fb = x["first_bad"]
        own = x["own_first_bad"]
        bad = [f"own {'+'.join(own[1])} at {own[0]}"] if own else []
        bad += [f"non-finite at {fb['nonfinite']}"] if fb["nonfinite"] is not None else []
        bad += [f"exception at {fb['exception']}"] if fb["exception"] is not None else []
        hs, w = x["health_steps"], x["replayable_window"]
        loss = f"{x['last_loss']:.4g}" if x["last_loss"] is not None else "-"
        lines.append(
            f"  {r:>4}  {f'{hs[0]}..{hs[1]}' if hs else '-':>11}  "
            f"{f'{w[0]}..{w[1]}' if w else '-':>11}  {loss:>10}  "
            f"{'closed' if x['closed_cleanly'] else 'not closed'}"
            f"{'; ' + ', '.join(bad) if bad else ''}"
        )
    lines.append(f"  culprit         {d['summary']}")
    return "\n".join(lines)


@click.command()
@click.argument("run", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(run: str, as_json: bool) -> int:
    """What RUN holds: steps, the replayable window, snapshots, first failure, environment.

    Works on a recording still being written and on one whose writer was killed. For a DDP run,
    RUN is the base path (run.h5 for run.rank0.h5, run.rank1.h5, ...), a directory or a glob:
    each rank's health side by side, and the first (step, rank) whose own values went bad; a
    set with a missing or damaged rank file is listed, then refused with exit code 7.
    """
    scan = rank_set(run, strict=False)
    if scan is not None:
        d = summarise(scan, detail=_steps_summary).to_json()
        text = render_rank_set(d)
        problem = scan.problem()
        if problem is not None:  # what is readable is listed; then the one-line error
            d = {**d, "error": problem, "exit_code": EXIT_INCOMPLETE_RANKS}
            click.echo(json.dumps(d, indent=2, default=str) if as_json else text)
            click.echo(f"replay: error: {term_safe(problem)}", err=True)
            return EXIT_INCOMPLETE_RANKS
    else:
        d = describe(run)
        text = render(d)
    cut = d.get("truncated")
    if cut:
        error = (
            f"{run}: the file is truncated ({cut['size']} of {cut['claimed']} bytes): a cut "
            "copy or a full disk; what is still readable is listed"
        )
        d = {**d, "error": error, "exit_code": EXIT_BAD_RECORDING}
    click.echo(json.dumps(d, indent=2, default=str) if as_json else text)
    if cut:
        click.echo(f"replay: error: {term_safe(error)}", err=True)
        return EXIT_BAD_RECORDING
    return EXIT_OK

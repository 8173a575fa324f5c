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
from ..ranks.summary import RankSetSummary, summarise
from ..reports.info import (
    BitwiseCuda,
    Hparams,
    InfoReport,
    RecordingSteps,
    Segment,
    Truncation,
    Trust,
    Writer,
)
from ..safetext import term_safe, term_safe_tree
from ..store import open_recording
from ..store.hparams import step_hparams
from ..store.liveness import writer_state
from ..store.reader import claimed_size
from ..store.segments import segment_files
from ..trust import standing

if TYPE_CHECKING:
    from ..store.reader import Recording

__all__ = ["info", "describe"]


def _steps_summary(rec: Recording) -> RecordingSteps:
    steps = rec.steps()
    h = rec.health()
    window = rec.replayable_window()
    status = rec.status()
    w = writer_state(rec.path)
    losses = h["loss"][np.isfinite(h["loss"])]
    return RecordingSteps(
        steps_recorded=status["steps_total"] or len(h["step"]),
        health_steps=[int(h["step"][0]), int(h["step"][-1])] if len(h["step"]) else None,
        batch_steps=[int(steps[0]), int(steps[-1])] if len(steps) else None,
        batch_count=len(steps),
        snapshots=[int(s) for s in rec.snapshot_steps()],
        replayable_window=[window.first, window.last] if window else None,
        reach=rec.reach(),
        not_replayable=rec.run_meta.not_replayable,
        first_bad=rec.first_bad(),
        last_loss=float(losses[-1]) if losses.size else None,
        closed_cleanly=bool(status["closed"]),
        ended=rec.ended(),
        writer=None if w is None else Writer(w.draining, w.steps_to_come, w.pid, w.writer_pid),
        damaged_steps=rec.damaged_steps(),
        damaged_health=sorted(rec.damaged_health),
        self_check=_self_check(rec.path, rec.run_id),
        # The other segments of this recording: a resumed run records beside it (run.1.h5)
        segments=[_segment(f) for f in segment_files(rec.path)],
        watched_objects=rec.watched_objects,
        hparams=_hparams(rec, steps),
    )


def _hparams(rec: Recording, steps: np.ndarray) -> Hparams | None:
    """``None`` without an optimizer or a readable step record."""
    if not len(steps):
        return None
    try:
        values = step_hparams(rec, int(steps[-1]))
    except (KeyError, RecordingError):
        return None
    return Hparams(int(steps[-1]), values) if values else None


def _self_check(path: str, run_id: str) -> dict[str, Any] | None:
    """The background self-check's verdict beside the file (docs/selfcheck.md), with its line."""
    from ..store.selfcheck import read_selfcheck

    v = read_selfcheck(path, run_id)
    return None if v is None else {**v.to_json(), "line": v.line()}


def _segment(path: str) -> Segment:
    try:
        with open_recording(path) as other:
            h = other.health()
            steps = [int(h["step"][0]), int(h["step"][-1])] if len(h["step"]) else None
    except RecordingError:
        steps = None
    return Segment(path, steps)


def _trust(rec: Recording) -> Trust:
    """Read only: no key is made."""
    try:
        got = standing(rec.meta, rec.sources, rec.run_id, rec.format_version)
    except RecordingError as e:  # its sources unreadable: shown, and never run
        return Trust("foreign", str(e), f"foreign ({e})")
    return Trust(got.kind, got.why, got.words())


def _bitwise_cuda(env: Any) -> BitwiseCuda | None:
    """``None`` for a run with no GPU (``store/bitwise.py``)."""
    from ..store.bitwise import cuda_blockers

    if not isinstance(env, dict) or not env.get("devices"):
        return None
    why = cuda_blockers(env)
    return BitwiseCuda(not why, why)


def describe(path: str) -> InfoReport:
    """Everything ``replay info`` shows of one recording."""
    with open_recording(path) as rec:
        meta = rec.meta
        out = InfoReport(
            path=path,
            format_version=rec.format_version,
            run_id=rec.run_id,
            created=rec.created,
            steps=_steps_summary(rec),
            config=rec.config,
            entry=rec.entry,
            program=rec.program,
            env=rec.env,
            bitwise_cuda=_bitwise_cuda(rec.env),
            environ_here=differs_here(rec.env.get("environ")),
            model={k: v for k, v in meta.get("model", {}).items() if k in ("class", "param_bytes")}
            | {"n_params": sum(p.numel for p in rec.run_meta.model.params)},
            optimizer=meta.get("optimizer"),
            scheduler=meta.get("scheduler"),
            scaler=meta.get("scaler"),
            objects=meta.get("objects"),
            distributed=meta.get("distributed"),
            trust=_trust(rec),
        )
    # A cut copy, a disk that filled up: the status dataset may still say "closed cleanly", and
    # what lies past the cut is gone. A file still being written is not judged (it grows).
    extent = claimed_size(path) if out.steps.writer is None else None
    if extent is not None and extent[0] < extent[1]:
        out.steps.truncated = Truncation(extent[0], extent[1])
    return out


def _steps_list(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:12])) + (
        f" (+{len(steps) - 12} more)" if len(steps) > 12 else ""
    )


def _fmt_range(r: list[int] | None) -> str:
    return f"steps {r[0]}..{r[1]}" if r else "none"


def render(report: InfoReport) -> str:
    d: InfoReport = term_safe_tree(report)  # its strings came from the file: replay/safetext.py
    s = d.steps
    lines = [f"{d.path}  (replay recording, format v{d.format_version}, run {d.run_id[:8]})"]
    w, cut = s.writer, s.truncated
    if cut:
        state = (
            f"TRUNCATED: the file holds {cut.size} of the {cut.claimed} bytes it claims "
            f"({100 * cut.size // max(cut.claimed, 1)}%); what is still readable is below"
        )
    elif s.closed_cleanly:
        state = "closed cleanly"
    elif w and w.draining:
        more = f": {w.steps_to_come} steps to come" if w.steps_to_come is not None else ""
        state = f"not closed: its training died, its writer is still committing{more}"
    elif w:
        state = f"being written (training process {w.pid})"
    else:
        state = "not closed (its training or its writer died, or a write failed: a full disk)"
    lines.append(f"  status          {state}")
    lines.append(f"  trust           {d.trust.line}")
    lines.append(f"  steps recorded  {s.steps_recorded}  (health for {_fmt_range(s.health_steps)})")
    kept, gaps = s.batch_steps, ""
    if kept and s.batch_count < kept[1] - kept[0] + 1:
        # a commit cut short (a writer killed, a full disk) rewrites the ring in parts
        gaps = f"  ({s.batch_count} of them: a commit was cut short)"
    lines.append(f"  batches kept    {_fmt_range(kept)}{gaps}")
    lines.append(f"  snapshots       {', '.join(map(str, s.snapshots)) if s.snapshots else 'none'}")
    nothing = (
        f"nothing: recorded without replay ({s.not_replayable})"
        if s.not_replayable
        else "nothing (no kept snapshot with its batches)"
    )
    window = s.replayable_window
    lines.append(f"  replayable      {_fmt_range(window) if window else nothing}")
    if s.reach and not s.not_replayable:
        from ..store.retention import describe_tiers

        r = s.reach  # any step of the last 10,000 (snapshots every 50 steps for the last 150, ...)
        lines.append(
            f"  reach           any step of the last {r['reach']:,} (snapshots "
            f"{describe_tiers(r['tiers'])}; {r['step_slots']:,} steps kept)"
        )
    if s.self_check:
        lines.append(f"  self-check      {s.self_check['line']}")
    if s.damaged_steps or s.damaged_health:
        parts = [f"step records {_steps_list(s.damaged_steps)}"] if s.damaged_steps else []
        parts += [f"health rows {_steps_list(s.damaged_health)}"] if s.damaged_health else []
        lines.append(
            f"  DAMAGED         {'; '.join(parts)}: their bytes fail their checksums, so they "
            "are treated as missing (never replayed)"
        )
    for seg in s.segments:
        where = _fmt_range(seg.health_steps) if seg.health_steps else "unreadable"
        lines.append(f"  other segment   {seg.path} ({where})")
    fb = s.first_bad
    bad = [f"first non-finite at step {fb['nonfinite']}"] if fb["nonfinite"] is not None else []
    bad += [f"exception at step {fb['exception']}"] if fb["exception"] is not None else []
    lines.append(
        f"  health          {'; '.join(bad) if bad else 'no NaN/Inf or exception recorded'}"
    )
    ended = report.steps.ended  # (described before it is made safe: its message's lines)
    if ended is not None:
        lines.append(f"  ended by        {term_safe(ended.describe())}")
    if s.last_loss is not None:
        lines.append(f"  last finite loss {s.last_loss:.6g}")
    m = d.model
    lines.append(f"  model           {m.get('class')}  ({m.get('n_params', 0):,} parameters)")
    opt = (d.optimizer or {}).get("class")
    lines.append(
        f"  optimizer       {opt or 'none (the step updates the parameters itself)'}"
        + (f", scheduler {d.scheduler.get('class')}" if d.scheduler else "")
        + (", GradScaler" if d.scaler else "")
    )
    hp = s.hparams or Hparams(0, {})
    for name, groups in hp.optimizers.items():
        for i, g in enumerate(groups):
            said = ", ".join(f"{k} {v:.6g}" for k, v in g.items()) or "no numbers"
            lines.append(f"  hyper-params    {name} group {i} at step {hp.step}: {said}")
    extra = (d.objects or {}).get("stateful") or []
    if extra:
        lines.append(f"  also kept       {', '.join(map(str, extra))} (named objects)")
    for role, e in d.entry.items():
        lines.append(f"  {role:<15} {e['module']}:{e['qualname']}  ({e['path']})")
    env = d.env
    lines.append(
        f"  environment     python {env.get('python')}, torch {env.get('torch')}, "
        f"{'CUDA ' + str(env.get('cuda')) + ' on ' + ', '.join(env.get('devices') or []) if env.get('devices') else 'CPU'}, "
        f"{env.get('num_threads')} threads, host {env.get('hostname')}"
    )
    bitwise = d.bitwise_cuda
    if bitwise:
        said = "possible" if bitwise.possible else "NOT possible: " + "; ".join(bitwise.why_not)
        lines.append(f"  bitwise CUDA    {said}")
    kept = (env.get("environ") or {}).get("digests")
    here = d.environ_here
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
    dd = d.distributed
    if dd:
        lines.append(
            f"  distributed     rank {dd.get('rank')} of {dd.get('world_size')} ({dd.get('backend')})"
        )
    return "\n".join(lines)


def render_rank_set(summary: RankSetSummary) -> str:
    d: RankSetSummary = term_safe_tree(summary)
    lines = [f"{d.spec}  (rank set of {d.world_size or len(d.rows)})"]
    if d.missing:
        lines.append(f"  missing ranks   {spans(list(d.missing))}")
    lines += [f"  DAMAGED         rank {r}: {why}" for r, why in list(d.damaged.items())[:20]]
    if len(d.damaged) > 20:
        lines.append(f"  DAMAGED         ... ({len(d.damaged) - 20} more ranks)")
    lines.append(
        f"  {'rank':>4}  {'steps':>11}  {'replayable':>11}  {'last loss':>10}  status / health"
    )
    for x in d.rows:
        fb, own = x.detail.first_bad if x.detail else {}, x.own_bad
        bad = [f"own {'+'.join(own[1])} at {own[0]}"] if own else []
        bad += [f"non-finite at {fb['nonfinite']}"] if fb.get("nonfinite") is not None else []
        bad += [f"exception at {fb['exception']}"] if fb.get("exception") is not None else []
        if x.ended is not None:  # (raised outside any step: a data loader, a validation loop)
            bad += [f"died {x.ended.when} ({x.ended.type})"]
        hs, w = x.health_steps, x.window
        loss = f"{x.last_loss:.4g}" if x.last_loss is not None else "-"
        lines.append(
            f"  {x.rank:>4}  {f'{hs[0]}..{hs[1]}' if hs else '-':>11}  "
            f"{f'{w[0]}..{w[1]}' if w else '-':>11}  {loss:>10}  "
            f"{'closed' if x.closed else 'not closed'}"
            f"{'; ' + ', '.join(bad) if bad else ''}"
        )
    # (described before it is made safe: a DataLoader worker's traceback is read by its lines)
    lines.append(f"  culprit         {term_safe(summary.summary)}")
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
        summary = summarise(scan, detail=_steps_summary)
        d, text = summary.to_json(), render_rank_set(summary)
        error, code = scan.problem(), EXIT_INCOMPLETE_RANKS  # what is readable is listed
    else:
        report = describe(run)
        d, text, cut = report.to_json(), render(report), report.steps.truncated
        error, code = None, EXIT_BAD_RECORDING
        if cut:
            error = (
                f"{run}: the file is truncated ({cut.size} of {cut.claimed} bytes): a cut "
                "copy or a full disk; what is still readable is listed"
            )
    if error is not None:
        d = {**d, "error": error, "exit_code": code}
    click.echo(json.dumps(d, indent=2, default=str) if as_json else text)
    if error is not None:
        click.echo(f"replay: error: {term_safe(error)}", err=True)
        return code
    return EXIT_OK

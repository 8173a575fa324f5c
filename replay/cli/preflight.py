"""``replay preflight -- python train.py ARGS``: is this run replayable? Ask before launching it."""

from __future__ import annotations

import json
import shlex

import click

from ..errors import EXIT_NOTHING_FOUND, EXIT_OK
from ..preflight import PreflightReport, run_preflight
from ..safetext import term_safe, term_safe_tree
from .render import render_cause

__all__ = ["preflight", "render_preflight"]

_KIND_WORDS = {
    "raised": "the replayed step raised",
    "outside_state": "state changed outside the step",
    "nondeterministic": "the same inputs give different bits (non-determinism)",
}


def render_preflight(rep: PreflightReport) -> str:
    lines = [f"replay preflight: {shlex.join(rep.command)}"]
    v = rep.verify
    if rep.recording is not None:
        lines.append(
            f"  recorded      up to {rep.steps} steps in {rep.run_seconds:.1f} s "
            f"(the run exited {rep.run_exit})"
        )
    if v is not None:
        lines.append(
            f"  replayed      {v.replayed_steps} steps in a fresh process on "
            f"{v.device}, window {v.window}"
        )
    if rep.ranks:
        lines.append(f"  ranks         {rep.ranks} rank files, replayed together")
    if rep.failure is not None or rep.failure_error is not None:
        return "\n".join(lines + _failure_lines(rep))
    if rep.replayable:
        lines.append("  verdict       REPLAYABLE: every step's loss and parameters match bitwise")
        lines.append(
            "                a crash of this run can be bisected and traced with replay bisect"
        )
        return "\n".join(lines)
    cause = v.cause if v is not None else None
    kind = str(cause.kind if cause is not None else None)
    lines.append(f"  verdict       NOT replayable: {_KIND_WORDS.get(kind, rep.reason)}")
    if cause is not None:
        lines += render_cause(cause)
    elif rep.verify_error:
        lines.append(f"  why           {rep.verify_error}")
    if rep.run_exit not in (0, None) or rep.recording is None:
        lines.append("  the run's last output:")
        lines.extend(f"    | {ln}" for ln in rep.run_tail[-8:])
    if rep.kept:
        lines.append(f"  recording     {rep.kept}")
    return "\n".join(lines)


def _failure_lines(rep: PreflightReport) -> list[str]:
    """The run failed within the preflight steps: that failure, bisected, is the finding."""
    f = term_safe_tree(rep.failure.to_json() if rep.failure is not None else {})
    v = rep.verify
    out = [f"  verdict       FAILED: {rep.reason}"]
    if rep.failure_error is not None:
        out.append(f"  bisect        {term_safe(rep.failure_error)}")
    else:
        cause = f", cause {f['cause']}" if f.get("cause") else ""
        out.append(f"  first bad     step {f.get('first_bad_step')} ({f.get('kind')}{cause})")
        if f.get("op"):
            where = f" in {f['module']}" if f.get("module") else ""
            out.append(f"  op            {f['op']} ({f.get('phase')}){where}")
        src = f.get("source") or {}
        if src.get("file"):
            out.append(f"  source        {src.get('file')}:{src.get('line')}")
        if f.get("exception"):
            exc = f["exception"]
            out.append(f"  exception     {exc.get('type')}: {exc.get('message', '')[:200]}")
    if v is not None:
        same = "yes, bitwise" if v.deterministic else "NO (replay verify says why)"
        out.append(f"  replays       {same}")
    if rep.kept:
        out.append(f"  recording     {rep.kept}  (kept: replay bisect / replay tui it)")
    return out


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--steps",
    default=8,
    show_default=True,
    type=click.IntRange(2, 10_000),
    help="Steps to record before the run is ended.",
)
@click.option(
    "--keep",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=str),
    help="Keep the preflight recording here (default: a temporary file, removed).",
)
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True, max=1e9),
    help="Seconds the run and the replay may take, each.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def preflight(
    steps: int, keep: str | None, timeout: float, as_json: bool, command: tuple[str, ...]
) -> int:
    """Run COMMAND (your own training command) for a few steps, replay them, say if it is
    replayable bitwise.

    \b
        replay preflight -- python train.py --lr 3e-4 --batch-size 64

    The first replay.Recorder that COMMAND creates records into a temporary file (its own path
    is left alone), snapshots at step 0 and half-way, and ends the run cleanly after --steps
    steps. The steps are then replayed in a fresh process, as `replay bisect` would after a
    crash. When they differ, the report says why: the replayed step raised (it needs state its
    batch and objects do not bring: a replay memory the loop fills), state changed outside the
    step (which objects), or real non-determinism; and what to change. The run's own output goes to stderr.
    Exit codes: 0 replayable, 1 not replayable, 2 usage error.
    """
    rep = run_preflight(
        list(command),
        steps=steps,
        keep=keep,
        timeout=timeout,
        echo=lambda line: click.echo(line, err=True),
    )
    click.echo(json.dumps(rep.json(), indent=2) if as_json else render_preflight(rep))
    return EXIT_OK if rep.replayable else EXIT_NOTHING_FOUND

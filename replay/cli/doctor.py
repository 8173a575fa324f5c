"""``replay doctor RUN.h5``: the debugging checklist over a recording. Reads the store only."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import click

from ..errors import EXIT_OK
from ..jsonsafe import json_safe
from ..safetext import term_safe

__all__ = ["doctor"]

_MARK = {"error": "✗ error  ", "warning": "! warning", "info": "· info   "}


_clean = json_safe  # JSON has no NaN/inf: strings, as everywhere (replay/jsonsafe.py)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        items = list(v.items())
        s = ", ".join(f"{k}={_fmt(x)}" for k, x in items[:4])
        return "{" + s + (", ..." if len(items) > 4 else "") + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v[:6]) + (", ..." if len(v) > 6 else "") + "]"
    return str(v)


def render(path: str, findings: list[Any]) -> str:
    # Titles, evidence and advice name modules and parameters from the file: term_safe each.
    path = term_safe(path)
    if not findings:
        return f"{path}: no findings: nothing in the recorded health looks wrong"
    n = {s: sum(f.severity == s for f in findings) for s in _MARK}
    lines = [f"{path}: {n['error']} errors, {n['warning']} warnings, {n['info']} notes", ""]
    for f in findings:
        lines.append(f"{_MARK[f.severity]}  [{term_safe(f.rule)}]  {term_safe(f.title)}")
        ev = "; ".join(f"{k} {_fmt(v)}" for k, v in f.evidence.items())
        lines += textwrap.wrap(
            "evidence: " + term_safe(ev), 96, initial_indent="    ", subsequent_indent="      "
        )
        lines += textwrap.wrap(
            "advice: " + term_safe(f.advice),
            96,
            initial_indent="    ",
            subsequent_indent="      ",
        )
        lines.append("")
    return "\n".join(lines).rstrip()


def _is_file(path: str) -> bool:
    import os

    return os.path.isfile(path)


def _rank_summary(rs: Any) -> dict[str, Any]:
    """Across the ranks: which went bad first, which is slow (median step wall time)."""
    import numpy as np

    from ..distributed.ranks import describe_failure, first_bad_rank

    first = first_bad_rank(rs)
    times: dict[int, float] = {}
    for r, rec in rs.recordings.items():
        w = rec.health().get("wall_time")
        if w is not None and np.isfinite(w).any():
            times[r] = float(np.median(w[np.isfinite(w)]))
    slowest = None
    if len(times) > 1:
        r = max(times, key=lambda k: times[k])
        others = float(np.median([t for k, t in times.items() if k != r]))
        slowest = {"rank": r, "median_step_s": times[r], "others_median_step_s": others}
    return {
        "world_size": rs.world_size,
        "missing": list(rs.missing),
        "first_bad": describe_failure(first),
        "first_bad_step": first.step if first is not None else None,
        "first_bad_ranks": list(first.ranks) if first is not None else [],
        "slowest": slowest,
    }


def _doctor_rank_set(run: str, as_json: bool) -> int:
    """Every rank's checklist, and across the ranks: who went bad first, who is slow."""
    from ..distributed.ranks import open_rank_set
    from ..doctor import diagnose

    with open_rank_set(run) as rs:
        summary = _rank_summary(rs)
        paths = dict(sorted(rs.paths.items()))
    per = {r: diagnose(p) for r, p in paths.items()}
    if as_json:
        out = {
            **summary,
            "ranks": {str(r): [_clean(f.as_dict()) for f in fs] for r, fs in per.items()},
        }
        click.echo(json.dumps(_clean(out), indent=2))
        return EXIT_OK
    lines = [f"{term_safe(run)}: a rank set of {len(paths)} ranks; {summary['first_bad']}"]
    if summary["missing"]:
        lines.append(f"  missing rank files: {', '.join(map(str, summary['missing']))}")
    slow = summary["slowest"]
    if slow is not None:
        ratio = (
            slow["median_step_s"] / slow["others_median_step_s"]
            if slow["others_median_step_s"]
            else 0
        )
        lines.append(
            f"  slowest: rank {slow['rank']}, median step {slow['median_step_s'] * 1e3:.1f} ms "
            f"({ratio:.2f}x the others' {slow['others_median_step_s'] * 1e3:.1f} ms)"
        )
    for r, fs in per.items():
        lines += ["", f"== rank {r} ==", render(paths[r], fs)]
    click.echo("\n".join(lines))
    return EXIT_OK


@click.command()
@click.argument("run", type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as a JSON list.")
def doctor(run: str, as_json: bool) -> int:
    """Check RUN against the classic training failures and say what to do.

    Initial loss against ln(C), a flat, rising or oscillating loss, exploding, vanishing or
    accumulating gradients, update/weight ratios, frozen or never-updated parameters, dead
    ReLUs, softmax before cross-entropy, unnormalised inputs, AMP loss-scale collapse. Reads the
    recording (and its forensics sidecar when present); runs no code. Exit 0 with findings.
    A DDP rank set (run.h5 for run.rank<N>.h5): every rank's checklist, the rank that went bad
    first and the slowest rank.
    """
    from ..distributed.ranks import resolve_rank_files
    from ..doctor import diagnose

    if not _is_file(run):
        files = resolve_rank_files(run)  # a DDP rank set: run.h5 for run.rank<N>.h5 (or a glob)
        if files is not None:
            return _doctor_rank_set(run, as_json)
    findings = diagnose(run)
    if as_json:
        click.echo(json.dumps([_clean(f.as_dict()) for f in findings], indent=2))
    else:
        click.echo(render(run, findings))
    return EXIT_OK

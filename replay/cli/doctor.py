"""``replay doctor RUN.h5``: the debugging checklist over a recording. Reads the store only."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import click

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


@click.command()
@click.argument("run", type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as a JSON list.")
def doctor(run: str, as_json: bool) -> int:
    """Check RUN against the classic training failures and say what to do.

    Initial loss against ln(C), a flat, rising or oscillating loss, exploding, vanishing or
    accumulating gradients, update/weight ratios, frozen or never-updated parameters, dead
    ReLUs, softmax before cross-entropy, unnormalised inputs, AMP loss-scale collapse. Reads the
    recording (and its forensics sidecar when present); runs no code. Exit 0 with findings.
    """
    from ..doctor import diagnose

    findings = diagnose(run)
    if as_json:
        click.echo(json.dumps([_clean(f.as_dict()) for f in findings], indent=2))
    else:
        click.echo(render(run, findings))
    return 0

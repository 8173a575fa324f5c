"""``replay doctor RUN.h5``: the debugging checklist over a recording. Reads the store only."""

from __future__ import annotations

import json
import os
import textwrap

import click

from ..errors import EXIT_OK
from ..ranks.scan import RankScan, rank_set, spans
from ..ranks.summary import summarise
from ..reports.doctor import DoctorReport, RankSetDoctorReport, SlowestRank
from ..safetext import term_safe

__all__ = ["doctor"]

_MARK = {"error": "✗ error  ", "warning": "! warning", "info": "· info   "}


def render(report: DoctorReport) -> str:
    # Titles, evidence and advice name modules and parameters from the file: term_safe each.
    path = term_safe(report.path)
    findings = report.findings
    if not findings:
        return f"{path}: no findings: nothing in the recorded health looks wrong"
    n = {s: sum(f.severity == s for f in findings) for s in _MARK}
    lines = [f"{path}: {n['error']} errors, {n['warning']} warnings, {n['info']} notes", ""]
    for f in findings:
        lines.append(f"{_MARK[f.severity]}  [{term_safe(f.rule)}]  {term_safe(f.title)}")
        ev = f.evidence_text(lambda v: f"{v:.4g}")
        for said in (f"evidence: {term_safe(ev)}", f"advice: {term_safe(f.advice)}"):
            lines += textwrap.wrap(said, 96, initial_indent="    ", subsequent_indent="      ")
        lines.append("")
    return "\n".join(lines).rstrip()


def _doctor_rank_set(run: str, scan: RankScan, as_json: bool) -> int:
    """Every rank's checklist, and across the ranks: which went bad first (the scan's), which
    is slow (median step wall time)."""
    from ..doctor import diagnose

    s = summarise(scan)
    slowest = s.slowest
    report = RankSetDoctorReport(
        world_size=s.world_size,
        missing=list(s.missing),
        first_bad=s.summary,
        first_bad_step=s.culprit_step,
        first_bad_ranks=list(s.culprit_ranks),
        slowest=None
        if slowest is None
        else SlowestRank(slowest[0].rank, slowest[0].median_step_s or 0.0, slowest[1]),
        ranks={str(r.rank): DoctorReport(r.path, diagnose(r.path)) for r in s.rows},
    )
    lines = [
        f"{term_safe(run)}: a rank set of {len(report.ranks)} ranks; {term_safe(report.first_bad)}"
    ]
    if report.missing:
        lines.append(f"  missing rank files: {spans(report.missing)}")
    slow = report.slowest
    if slow is not None:
        ratio = slow.median_step_s / slow.others_median_step_s if slow.others_median_step_s else 0
        lines.append(
            f"  slowest: rank {slow.rank}, median step {slow.median_step_s * 1e3:.1f} ms "
            f"({ratio:.2f}x the others' {slow.others_median_step_s * 1e3:.1f} ms)"
        )
    for r, per in report.ranks.items():
        lines += ["", f"== rank {r} ==", render(per)]
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else "\n".join(lines))
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
    from ..doctor import diagnose

    if not os.path.isfile(run):
        scan = rank_set(run)  # a DDP rank set: run.h5 for run.rank<N>.h5 (or a glob)
        if scan is not None:
            return _doctor_rank_set(run, scan, as_json)
    report = DoctorReport(run, diagnose(run))
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else render(report))
    return EXIT_OK

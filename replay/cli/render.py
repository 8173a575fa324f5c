"""The reports of ``replay bisect``, ``verify`` and ``trace`` as a person reads them.

The workflows return each report as a dataclass (``replay.reports``: ``BisectReport``,
``VerifyReport``, ``TraceReport``); the CLI prints its ``to_json()`` with ``--json`` and these
words without. Strings that came from a file pass through ``term_safe_tree`` first (a copy of
the report), so none reaches the terminal raw.
"""

from __future__ import annotations

from typing import Any

from ..ranks.first_bad import describe_after
from ..reports import BisectReport, DivergenceCause, TraceReport, VerifyReport
from ..reports.ranks import MultiRankRun, RankReplay
from ..safetext import term_safe, term_safe_tree
from ..words import cause_text, op_role, ran_at, role_text, samples_text

__all__ = ["render_cause", "render_ranks", "render_trace", "render_verdict", "render_verify"]


def _op_where(o: dict[str, Any]) -> str:
    """``op (phase) in module``: an op as every report names it (``<model>``: the root)."""
    where = f"{o['op']} ({o.get('phase')})"
    if o.get("module") is not None:
        where += f" in {o['module'] or '<model>'}"
    return where


def _source_lines(src: Any, label: str = "") -> list[str]:
    """``file:line in function`` and its code, after ``label`` (none: nothing to say)."""
    if not isinstance(src, dict):
        return []
    where = f"{src.get('file')}:{src.get('line')}"
    if src.get("function"):
        where += f" in {src['function']}"
    code = (src.get("code") or "").strip()
    return [f"  {label:<14}{where}" + (f"\n      {code}" if code else "")]


def render_verdict(report: BisectReport) -> str:
    d: BisectReport = term_safe_tree(report)
    w = d.window
    if d.healthy:
        span = f"steps {d.checked[0]}..{d.checked[1]}" if d.checked else "no steps"
        failure = report.rank_set.first_bad if report.rank_set is not None else None
        if report.rank_set is None:
            said = f"healthy: no step matches {d.criterion!r} in the recorded health ({span}; "
        else:  # (the scan judged every rank by its own values; the span is the culprit's)
            said = (
                f"healthy: no rank's own values match {d.criterion!r} (rank "
                f"{report.rank_set.replayed_rank}'s {span}; "
            )
        said += f"replayable window steps {w[0]}..{w[1]})"
        if report.ended is None:
            return said
        who = "the program" if failure is None else f"rank {failure.rank}"
        said += f"\n  but {who} died: {term_safe(report.ended.describe())}"
        if failure is not None and failure.after is not None:
            said += f"\n  then {term_safe(describe_after(failure.after))}"
        if report.ended.kind == "killed":  # (no exception: nothing more is kept)
            return said
        return (
            f"{said}\n  no step raised it, so no replay of a step can: "
            f"`replay info {d.recording} --json` holds its traceback"
        )
    first, sym = d.first_bad_step, d.symptom_step
    head = f"first bad step: {first}"
    if sym is not None and sym != first:
        head += f"  (the symptom was recorded at step {sym})"
    lines = [head, f"  kind          {d.kind}: {d.criterion}"]
    if d.exception:
        lines.append(f"  exception     {d.exception['type']}: {d.exception['message']}")
    if d.loss is not None and not d.exception:
        lines.append(f"  loss          {d.loss}   grad norm {d.grad_norm}")
    cause = cause_text(d)
    if cause:
        lines.append(f"  cause         {cause}")
    for t in (d.data or {}).get("tensors") or []:
        counts = ", ".join(
            f"{t[k]} {w}"
            for k, w in (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf"))
            if t[k]
        )
        at = " ".join(str(p) for p in t["positions"]) + (
            " ..." if t["count"] > len(t["positions"]) else ""
        )
        lines.append(f"  data          {t['name']} {t['dtype']}{t['shape']}: {counts} at {at}")
    if d.op:
        # the word only: the cause line above gives the why
        word = op_role(d, d.op_index, "producer")[0]
        lines.append(f"  op            {_op_where(d.culprit_json())}  [{word}]")
    if d.op and d.closure is not None:
        lines.append(f"  closure call  {d.closure + 1} (the step's optimizer called it)")
    lines += _source_lines(d.source, "source")
    lines += _source_lines(ran_at(d), "ran at")
    surf = d.surfaced
    if surf:
        where = _op_where(surf)
        if surf.get("closure") is not None:
            where += f", closure call {surf['closure'] + 1}"
        lines.append(f"  surfaced at   {where}: {surf.get('how')}")
        lines += _source_lines(surf.get("source"))
    conv = d.nan_from_inf
    if conv:
        role = role_text(d, conv.get("op_index"), "propagator")
        lines.append(f"  NaN from      {_op_where(conv)}  [{role}]")
        lines += _source_lines(conv.get("source"))
    if d.samples:
        lines.append(f"  samples       {samples_text(d)}")
    why = d.divergence_cause
    lines.append(
        "  reproducible  "
        + (
            "yes (two replays and the recording agree bitwise)"
            if d.reproducible
            else "NO: the environment differs from the recorded run's (why it differs, below)"
            if why is not None and why.changed_environ
            else "NO: suspect non-determinism, hardware, or state no snapshot holds"
        )
    )
    det = "yes" if d.deterministic else "no"
    if d.divergence:
        dv = d.divergence
        det += (
            f" (step {dv.step}, {dv.column}: recorded {dv.recorded}, replayed "
            f"{dv.replayed}, |diff| {dv.abs_diff})"
        )
    lines.append(f"  deterministic {det}")
    lines.extend(render_cause(d.divergence_cause))
    lines.append(
        f"  replayed      {d.replayed_steps} steps from the snapshot before step {d.snapshot}"
        f" (+{d.rechecked_steps} to re-check) on {d.device}; window steps {w[0]}..{w[1]}"
    )
    if d.forensics:
        lines.append(f"  forensics     {d.forensics}  (replay tui shows them)")
    lines.extend(render_ranks(d.multi_rank, d.ranks))
    lines += [f"  note: {n}" for n in d.notes]
    return "\n".join(lines)


def _span(steps: list[int]) -> str:
    if not steps:
        return "no steps"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}..{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}"
    return "steps " + ", ".join(map(str, steps))


def render_ranks(mr: MultiRankRun | None, ranks: dict[str, RankReplay] | None) -> list[str]:
    """The lines of a multi-rank replay (``ranks``): each rank's own bitwise check and what its
    trace found. Empty for a single process."""
    if not mr or not ranks:
        return []
    lines = [
        f"  ranks         {mr.world_size} replayed together ({mr.backend}), led by rank {mr.leader}"
    ]
    for r, s in sorted(ranks.items(), key=lambda kv: int(kv[0])):
        dv = s.divergence
        check = (
            "bitwise"
            if dv is None
            else f"DIFFERS at step {dv.step} ({dv.column}: recorded {dv.recorded}, "
            f"replayed {dv.replayed})"
        )
        line = f"    rank {r:<7}{_span(s.replayed_steps or [])} {check}"
        if s.peer_failed_steps:
            line += f"; {_span(s.peer_failed_steps)} without the all-reduce (a peer raised)"
        lines.append(line)
        tr = s.trace
        if tr:
            if tr.get("op"):
                what = _op_where(tr)
            else:
                what = tr.get("received") or "no op made a non-finite value"
            lines.append(f"      trace     {what}  [{tr.get('forensics')}]")
    return lines


_HEADLINES = {
    "raised": "replay FAILED: the replayed step raised",
    "outside_state": "NOT replayable as recorded: state changed outside the step",
    "nondeterministic": "NOT deterministic: the same inputs give different bits",
}


def render_cause(c: DivergenceCause | None) -> list[str]:
    """The ``cause`` lines shared by the verify, bisect and preflight reports."""
    if not c:
        return []
    lines = [f"  why differs   {c.kind}: {c.summary}"]
    for d in c.differs or []:
        size = d.max_abs_diff
        more = f" (+{d.count - len(d.names)} more)" if d.count > len(d.names) else ""
        lines.append(
            f"    differs     {d.object}: {', '.join(d.names)}{more}"
            + (f", max |diff| {size:.3g}" if isinstance(size, float) else "")
        )
    lines.append(f"  what to do    {c.hint}")
    return lines


def render_verify(report: VerifyReport) -> str:
    d: VerifyReport = term_safe_tree(report)
    w = d.window
    n = d.replayed_steps
    bad = [s for s in d.steps if not s.match]
    extra = render_ranks(d.multi_rank, d.ranks)
    extra += [f"  note: {note}" for note in d.notes or []]
    if not bad:
        every = " on every rank" if d.multi_rank else ""
        head = (
            f"deterministic: all {n} steps of the window ({w[0]}..{w[1]}) replay bitwise "
            f"(loss and parameter fingerprint){every} on {d.device}"
            if d.deterministic
            else "NOT bitwise on every rank"  # the leading rank matched, another did not
        )
        return "\n".join([head, *extra])
    fd = d.first_divergence
    assert fd is not None  # (a step differs)
    cause = d.cause
    head = _HEADLINES.get(cause.kind if cause else "", "NOT bitwise")
    lines = [
        f"{head}: {len(bad)} of {n} steps differ from the recording "
        f"(window {w[0]}..{w[1]}, on {d.device})",
        f"  first divergence at step {fd.step}, {fd.column}: "
        + (
            f"carried on from step {fd.carried_on} {fd.recorded}, from its own snapshot "
            if fd.carried_on is not None
            else f"recorded {fd.recorded}, "
        )
        + f"replayed {fd.replayed}, |diff| {fd.abs_diff}"
        + (f", {fd.ulps} ulps" if fd.ulps is not None else ""),
        "  differing steps: "
        + ", ".join(str(s.step) for s in bad[:20])
        + (" ..." if len(bad) > 20 else ""),
        *render_cause(cause),
        *extra,
    ]
    return "\n".join(lines)


def render_trace(report: TraceReport) -> str:
    """``replay trace``'s report in words: the step, and the op that made its first non-finite
    value (or that none did)."""
    d: TraceReport = term_safe_tree(report)
    what = (
        f"first non-finite value made by {d.op} ({d.phase})"
        if d.op
        else "no op made a non-finite value"
    )
    if d.surfaced:
        what += f", noticed later at {d.surfaced['op']} ({d.surfaced.get('phase')})"
    return (
        f"traced step {d.step} (window {d.window[0]}..{d.window[1]}): {what}\n"
        f"  forensics     {d.forensics}  (replay tui {d.recording} shows every op)"
    )

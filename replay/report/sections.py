"""The page's sections as HTML, one function each, from :class:`~replay.report.facts.RunFacts`.

Every string that came from the file goes through ``esc`` (``escape.py``); numbers are written
with ``replay.words.fmt_num``, as the TUI writes them; an op's part in the failure is worded by
``replay.words`` as ``replay bisect`` and the TUI word it.
"""

from __future__ import annotations

import math
import shlex
from functools import partial
from typing import Any

import numpy as np

from ..words import cause_text, fmt_num, op_role, ran_at, samples_text
from .escape import esc, esc_code
from .facts import LayerMap, RunFacts
from .svg import Mark, heat_map, line_plot

__all__ = [
    "verdict_section",
    "health_section",
    "layers_section",
    "ops_section",
    "params_section",
    "doctor_section",
    "ranks_section",
    "run_section",
]

_STATS = ("min", "max", "mean", "absmax")


def _kv(rows: list[tuple[str, str]]) -> str:
    """A two-column table; ``rows`` are ``(label, html)`` with the html already escaped."""
    body = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _op_where(o: dict[str, Any]) -> str:
    """``op (phase) in module`` as every report names an op (``<model>``: the root)."""
    where = f"<code>{esc(o.get('op'))}</code> ({esc(o.get('phase'))})"
    if o.get("module") is not None:
        where += f" in <code>{esc(o['module'] or '<model>')}</code>"
    return where


def _source(src: Any, sources: dict[str, dict[int, str]], context: int = 3) -> str:
    """``file:line in function`` and its code: the recorded lines around it when the sidecar
    kept them (the line itself marked), else the verdict's one line."""
    if not isinstance(src, dict):
        return ""
    where = f"<code>{esc(src.get('file'))}:{esc(src.get('line'))}</code>"
    if src.get("function"):
        where += f" in <code>{esc(src['function'])}</code>"
    line = src.get("line")
    lines = sources.get(str(src.get("file")), {}) if isinstance(line, int) else {}
    if isinstance(line, int) and line in lines:
        shown = []
        for n in range(max(1, line - context), line + context + 1):
            if n in lines:
                text = f"{n:>5}  {esc_code(lines[n])}"
                shown.append(f'<span class="hit">{text}</span>' if n == line else text)
        return f"{where}<pre>{chr(10).join(shown)}</pre>"
    code = str(src.get("code") or "").strip()
    return where + (f"<pre>{esc_code(code)}</pre>" if code else "")


def _reproducible(f: RunFacts) -> str:
    b = f.bisect
    if b is None or b.reproducible is None:
        kept = f.verdict.reproducible if f.verdict is not None else None
        if kept is not None:  # what bisect found, kept in the sidecar
            return _said_reproducible(kept)
        return (
            '<span class="note">not kept beside the recording: <code>replay bisect</code> '
            "prints it (give its <code>--json</code> to <code>replay report --bisect</code>)"
            "</span>"
        )
    if b.first_bad_step != f.traced_step:  # another bisect's report (another run, a retrace)
        return (
            f'<span class="warn">unknown: the --bisect report names step '
            f"{esc(b.first_bad_step)}, the sidecar step {esc(f.traced_step)}</span>"
        )
    return _said_reproducible(b.reproducible)


def _said_reproducible(yes: bool) -> str:
    if yes:
        return '<span class="ok">yes</span> (two replays and the recording agree bitwise)'
    return (
        '<span class="bad">NO</span>: suspect non-determinism, hardware, or state no snapshot holds'
    )


def _commands(f: RunFacts, name: str) -> str:
    env = f.meta.get("env") or {}
    argv = [str(a) for a in env.get("argv") or [] if isinstance(a, (str, int, float))]
    rows = [("find it again", f"<code>replay bisect {esc(shlex.quote(name))}</code>")]
    if f.traced_step is not None:
        trace = f"<code>replay trace {esc(shlex.quote(name))} --step {f.traced_step}</code>"
        rows.append(("trace the step", trace))
    if argv:
        again = (
            f"<code>python {esc(shlex.join(argv))}</code> in <code>{esc(env.get('cwd'))}</code>"
            " (the recorded program, up to its Recorder; only with your trust: "
            "<code>replay trust</code>)"
        )
        rows.append(("which runs again", again))
    return _kv(rows)


def verdict_section(f: RunFacts, name: str) -> str:
    """The verdict as ``replay bisect`` states it, the self-check's, and how to reproduce it."""
    v = f.verdict
    if f.selfcheck is not None:
        cls = "bad" if f.selfcheck.failed else ("ok" if f.selfcheck.status == "ok" else "note")
        check = f'<p>self-check: <span class="{cls}">{esc(f.selfcheck.line())}</span></p>'
    else:
        check = '<p class="note">self-check: no verdict beside the recording</p>'
    if v is None:
        why = {
            "absent": "no forensics sidecar beside the recording",
            "it belongs to another run": "the sidecar beside it belongs to another run",
        }.get(f.forensics_missing or "absent", f"the sidecar was {f.forensics_missing}")
        symptom = (
            f'<p>The recording shows the first NaN/Inf or exception at <b id="first-bad">step '
            f"{f.symptom}</b>.</p>"
            if f.symptom is not None
            else "<p>The recording shows no NaN/Inf and no exception.</p>"
        )
        if f.symptom is None and f.ended is not None:
            symptom += (
                f'<p class="warn" id="ended">But the program died: {esc(f.ended.describe())}.</p>'
            )

        box = "verdict" if f.symptom is not None else "verdict healthy"
        return (
            f'<section id="verdict"><h2>Verdict</h2><div class="{box}">'
            f'{symptom}<p class="warn" id="no-forensics">{esc(why)}: what follows is what the '
            "recording alone holds. <code>replay bisect "
            f"{esc(shlex.quote(name))}</code> adds the op-level part: the first bad step "
            "confirmed by replay, the op that made the first NaN/Inf, its module and source "
            "line, the culprit samples and whether it reproduces.</p></div>"
            f"{check}{_commands(f, name)}</section>"
        )
    healthy = v.kind == "none"
    rows: list[tuple[str, str]] = [("kind", esc(v.kind))]
    if healthy:
        head = f"step {f.traced_step} traced: no op made a non-finite value"
    else:
        head = f'first bad step: <b id="first-bad">{esc(f.traced_step)}</b>'
        if f.symptom is not None and f.symptom != f.traced_step:
            head += f" (the symptom was recorded at step {esc(f.symptom)})"
    if v.exception:
        rows.append(
            ("exception", f"{esc(v.exception.get('type'))}: {esc(v.exception.get('message'))}")
        )
    if cause := cause_text(v):
        rows.append(("cause", esc(cause)))
    if v.op:
        word = op_role(v, v.op_index, "producer")[0]
        rows.append(("op", f'<span id="culprit-op">{_op_where(v.to_json())}</span> [{esc(word)}]'))
        rows.append(("phase", esc(v.phase)))
        rows.append(("module", f"<code>{esc(v.module if v.module is not None else '-')}</code>"))
    if v.closure is not None:
        rows.append(("closure call", f"{esc(v.closure + 1)} (the step's optimizer called it)"))
    if v.source:
        rows.append(("source", _source(v.source, f.sources)))
    if ran := ran_at(v):
        rows.append(("ran at", _source(ran, f.sources)))
    if s := v.surfaced:
        rows.append(("surfaced at", f"{_op_where(s)}: {esc(s.get('how'))}"))
    if c := v.nan_from_inf:
        rows.append(("NaN from", f"{_op_where(c)} turned its {esc(c.get('from'))} into NaN"))
    if v.samples:
        rows.append(("samples", f'<span id="samples">{esc(samples_text(v))}</span>'))
    if not healthy:
        rows.append(("reproducible", _reproducible(f)))
    if v.sinks:
        rows.append(("non-finite", esc("; ".join(map(str, v.sinks)))))
    notes = "".join(f'<li class="note">{esc(n)}</li>' for n in v.notes)
    return (
        f'<section id="verdict"><h2>Verdict</h2><div class="verdict{" healthy" if healthy else ""}">'
        f"<p>{head}</p>{_kv(rows)}{f'<ul>{notes}</ul>' if notes else ''}</div>{check}"
        f"{_commands(f, name)}</section>"
    )


def _marks(f: RunFacts) -> list[Mark]:
    marks = [Mark(s, "snapshot", "snapshot") for s in f.snapshots[-12:]]
    if f.symptom is not None and f.symptom != f.first_bad:
        marks.append(Mark(f.symptom, f"symptom {f.symptom}", "symptom"))
    if f.first_bad is not None:
        # bisect's step when it traced one; else only what the health shows, said as such
        said = "first bad step" if f.verdict is not None else "first NaN/Inf recorded at"
        marks.append(Mark(f.first_bad, f"{said} {f.first_bad}", "bad"))
    return marks


def health_section(f: RunFacts) -> str:
    """Loss, gradient norm (before any clip), learning rate and update ratio over the steps."""
    h = f.health
    steps = h["step"]
    w = f.window
    plot = partial(line_plot, marks=_marks(f), window=w)  # every plot: the same marks, window
    never = np.zeros(len(steps), dtype=bool)
    ratio = "update ratio (median over weight tensors, per step, between snapshots)"
    plots = [
        plot(steps, h["loss"], title="loss", bad=h["loss_nonfinite"] == 1, plot_id="plot-loss"),
        plot(
            steps,
            h["grad_norm"],
            title="gradient norm (before any clip)",
            log=True,
            bad=(h["grad_nonfinite"] == 1) & (h["scaler_skipped"] != 1),
            plot_id="plot-grad-norm",
        ),
        plot(steps, h["lr"], title="learning rate (param group 0)", bad=never, plot_id="plot-lr"),
        plot(f.update_steps, f.update_ratio, title=ratio, log=True, plot_id="plot-update-ratio")
        if len(f.update_steps)
        else '<p class="note">update ratio: fewer than two kept snapshots</p>',
    ]
    focus, at = f.first_bad, ""
    i = np.flatnonzero(steps == focus) if focus is not None else np.zeros(0, dtype=np.int64)
    if i.size:
        cells = ", ".join(
            f'{esc(label)} <span class="mono" data-key="{esc(label)}">'
            f"{esc(fmt_num(float(h[key][i[0]])))}</span>"
            for key, label in (("loss", "loss"), ("grad_norm", "grad norm"), ("lr", "lr"))
        )
        at = f'<p id="health-at-bad">at step {focus}: {cells}</p>'
    legend = (
        '<p class="legend"><span><span class="sw" style="background:#e3f0ff"></span>replayable '
        f"window{esc(f' (steps {w[0]}..{w[1]})') if w else ': none'}</span>"
        '<span><span class="sw" style="background:#b00020"></span>first bad step / NaN/Inf</span>'
        '<span><span class="sw" style="background:#888"></span>snapshot</span></p>'
    )
    return f'<section id="health"><h2>Health over the recorded steps</h2>{legend}{at}{"".join(plots)}</section>'


def layers_section(f: RunFacts) -> str:
    maps: list[LayerMap] = f.layers
    if not maps:
        return (
            '<section id="layers"><h2>Per layer over steps</h2><p class="note">The recording '
            "keeps no per-layer values over steps (one model, fewer than two kept snapshots); "
            "the traced step's own per-parameter gradients are below.</p></section>"
        )
    marks = [m for m in _marks(f) if m.kind == "bad"]
    body = "".join(
        heat_map(m.labels, m.steps, m.values, title=m.title, bad=m.bad, marks=marks) for m in maps
    )
    return f'<section id="layers"><h2>Per layer over steps</h2>{body}</section>'


def _num_cell(v: Any) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return '<td class="num"></td>'
    data = "NaN" if math.isnan(x) else repr(x)
    return f'<td class="num" data-v="{esc(data)}">{esc(fmt_num(x))}</td>'


def ops_section(f: RunFacts) -> str:
    """The traced ops around the culprit, with their statistics and modules (a table the
    page's script sorts and filters)."""
    ops = f.ops
    if ops is None or f.verdict is None:
        return (
            '<section id="ops-section"><h2>Traced ops</h2><p class="note">No traced step: '
            "<code>replay bisect</code> (or <code>replay trace --step N</code>) traces one per "
            "op.</p></section>"
        )
    heads = ("#", "phase", "op", "module", "part", "output", *_STATS, "NaN", "Inf", "source")
    nums = {"#", *_STATS, "NaN", "Inf"}  # the columns the script sorts as numbers
    th = "".join(f'<th data-sort="{"num" if h in nums else "text"}">{esc(h)}</th>' for h in heads)
    rows = []
    for r in ops.rows:
        i = int(r["index"])
        status = str(r["status"])
        word = op_role(f.verdict, i, status)[0]
        st = r.get("stats") or {}
        cls = "culprit" if i == ops.culprit else status
        inf = (st.get("posinf") or 0) + (st.get("neginf") or 0)
        rows.append(
            f'<tr class="{esc(cls)}" id="op-{i}"><td class="num" data-v="{i}">{i}</td>'
            f"<td>{esc(r['phase'])}</td><td>{esc(r['op'])}</td>"
            f"<td>{esc(r['module'] if r['module'] is not None else '')}</td><td>{esc(word)}</td>"
            f"<td>{esc(r.get('outputs') or '')}</td>"
            + "".join(_num_cell(st.get(k)) for k in _STATS)
            + _num_cell(st.get("nan"))
            + _num_cell(inf)
            + f"<td>{esc(r.get('source') or '')}</td></tr>"
        )
    first, last = (ops.rows[0]["index"], ops.rows[-1]["index"]) if ops.rows else (0, -1)
    return (
        '<section id="ops-section"><h2>Traced ops around the culprit</h2>'
        f'<p class="note">ops {first}..{last} of the {ops.n_ops:,} of step {f.traced_step} '
        "(statistics of each op's first floating output, over its finite values; "
        "<code>replay tui</code> shows every op).</p>"
        f'<div class="scroll"><table class="grid" id="ops"><thead><tr>{th}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div></section>"
    )


def params_section(f: RunFacts) -> str:
    if not f.params:
        return ""
    heads = ("parameter", "grad norm", "grad NaN", "grad Inf", "weight norm", "update ratio")
    th = "".join(f"<th>{esc(h)}</th>" for h in heads)
    rows = "".join(
        f"<tr><td>{esc(p.get('name'))}</td>"
        + "".join(
            _num_cell(p.get(k))
            for k in ("grad_norm", "grad_nan", "grad_inf", "weight_norm", "update_ratio")
        )
        + "</tr>"
        for p in f.params[:500]
    )
    return (
        f'<section id="params"><h2>Parameters at step {f.traced_step}</h2>'
        f'<div class="scroll"><table class="grid"><thead><tr>{th}</tr></thead>'
        f"<tbody>{rows}</tbody></table></div></section>"
    )


def doctor_section(f: RunFacts) -> str:
    if not f.findings:
        return (
            '<section id="doctor"><h2>Doctor</h2><p>No findings: nothing in the recorded '
            "health looks wrong.</p></section>"
        )
    items = "".join(
        f'<li><span class="sev-{esc(x.severity)}">{esc(x.severity)}</span> '
        f"[<code>{esc(x.rule)}</code>] {esc(x.title)}<br>"
        f'<span class="note">evidence: {esc(x.evidence_text(fmt_num))}</span><br>'
        f"advice: {esc(x.advice)}</li>"
        for x in f.findings
    )
    return f'<section id="doctor"><h2>Doctor</h2><ul>{items}</ul></section>'


def ranks_section(f: RunFacts) -> str:
    """A rank set: every rank side by side, the first bad (step, rank), the slowest rank."""
    t = f.ranks
    if t is None:
        return ""
    heads = ("rank", "steps", "replayable", "last loss", "median step", "status / health")
    th = "".join(f"<th>{esc(h)}</th>" for h in heads)
    rows = []
    for x in t.rows:
        hs, w, own = x.health_steps, x.window, x.own_bad
        bad = f"; own {'+'.join(own[1])} at step {own[0]}" if own else ""
        cls = ' class="culprit"' if x.rank in t.culprit_ranks else ""
        took = f"{x.median_step_s * 1e3:.1f} ms" if x.median_step_s is not None else "-"
        rows.append(
            f"<tr{cls}><td>{x.rank}</td><td>{esc(f'{hs[0]}..{hs[1]}' if hs else '-')}</td>"
            f"<td>{esc(f'{w[0]}..{w[1]}' if w else '-')}</td>"
            f"<td>{esc(fmt_num(x.last_loss) if x.last_loss is not None else '-')}</td>"
            f"<td>{esc(took)}</td><td>{'closed' if x.closed else 'not closed'}{esc(bad)}</td></tr>"
        )
    slow = ""
    if t.slowest is not None:
        row, others = t.slowest
        ratio = (row.median_step_s or 0.0) / others if others else 0.0
        slow = (
            f'<p>slowest rank: <span id="rank-slowest">{row.rank}</span>, median step '
            f"{(row.median_step_s or 0.0) * 1e3:.1f} ms ({ratio:.2f}x the others' "
            f"{others * 1e3:.1f} ms)</p>"
        )
    missing = f'<p class="warn">missing ranks: {esc(list(t.missing))}</p>' if t.missing else ""
    return (
        f'<section id="ranks"><h2>Ranks ({esc(t.world_size or len(t.rows))})</h2>'
        f'<p>first bad: <span id="rank-culprit">{esc(t.summary)}</span></p>{slow}{missing}'
        f'<table class="grid"><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody>'
        "</table></section>"
    )


def run_section(f: RunFacts) -> str:
    m = f.meta
    env = m.get("env") or {}
    model = m.get("model") or {}
    opt = (m.get("optimizer") or {}).get("class")
    sched = (m.get("scheduler") or {}).get("class")
    scaler = " + GradScaler" if m.get("scaler") else ""
    optim = esc(opt or "none") + (f" + {esc(sched)}" if sched else "") + scaler
    where = (
        f"python {env.get('python')}, torch {env.get('torch')}, "
        f"{env.get('num_threads')} threads, host {env.get('hostname')}"
    )
    rows = [
        ("recording", f"<code>{esc(f.path)}</code> (run {esc(f.run_id[:8])})"),
        ("status", "closed cleanly" if f.status.get("closed") else "not closed"),
        ("steps recorded", esc(f.status.get("steps_total", len(f.health["step"])))),
        ("replayable", esc(f"steps {f.window[0]}..{f.window[1]}" if f.window else "nothing")),
        ("snapshots", esc(", ".join(map(str, f.snapshots[-20:])) or "none")),
        ("model", f"{esc(model.get('class'))} ({f.n_params:,} parameters)"),
        ("optimizer", optim),
        ("environment", esc(where)),
    ]
    for role, e in (m.get("entry") or {}).items():
        if isinstance(e, dict):
            where = f"<code>{esc(e.get('module'))}:{esc(e.get('qualname'))}</code>"
            rows.append((str(role), f"{where} (<code>{esc(e.get('path'))}</code>)"))
    return f'<section id="run"><h2>Run</h2>{_kv(rows)}</section>'

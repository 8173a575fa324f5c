"""Overview: the recorded window as plots (loss, gradient norm, learning rate, GradScaler scale)
with marks, the run's metadata and entry points, and the health of the step under the cursor."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static

from replay.child import run_replay
from replay.errors import EXIT_NOTHING_FOUND, EXIT_OK, RecordingError
from replay.reports import StepResult, WhatIfReport
from replay.safetext import term_safe
from replay.store.hparams import step_hparams
from replay.store.selfcheck import read_selfcheck
from replay.words import cause_text, op_role

from ..model import shorten_path
from ..widgets.marks import LEGEND, MARK_STYLES, MarkStrip
from ..widgets.plot import SeriesPlot, fmt_num
from .base import RunScreen
from .whatif import WhatIfForm

__all__ = ["OverviewScreen"]

PLOTS = (
    ("loss", "loss", False),
    ("grad_norm", "gradient norm", True),
    ("lr", "learning rate", False),
    ("scale", "GradScaler scale", True),
)
# the health columns that flag a step (1), and how the cursor's panel names them
HEALTH_FLAGS = (
    ("loss_nonfinite", "loss NaN/Inf"),
    ("grad_nonfinite", "grad NaN/Inf"),
    ("param_nonfinite", "param NaN/Inf"),
    ("scaler_skipped", "AMP skipped"),
    ("raised", "raised"),
)


class OverviewScreen(RunScreen):
    TITLE_SUFFIX = "overview"
    CSS_PATH = "overview.tcss"
    BINDINGS = [
        Binding("left,h", "move(-1)", "step ←"),
        Binding("right,l", "move(1)", "step →"),
        Binding("shift+left,H", "move(-10)", "10 ←", show=False),
        Binding("shift+right,L", "move(10)", "10 →", show=False),
        Binding("home", "jump('first')", "first", show=False),
        Binding("end", "jump('last')", "last", show=False),
        Binding("f", "jump('bad')", "first bad"),
        Binding("t", "trace", "trace step"),
        Binding("w", "whatif", "what-if"),
    ]

    def compose_body(self) -> ComposeResult:
        with Horizontal():
            with Vertical(id="plots"):
                for key, title, log in PLOTS:
                    yield SeriesPlot(title + (" (log)" if log else ""), log=log, id=f"plot-{key}")
                yield MarkStrip(id="marks")
                with Vertical(id="whatif-panel"):
                    yield Static(id="whatif-verdict")
                    with Horizontal(id="whatif-plots"):
                        yield SeriesPlot("loss as recorded (log)", log=True, id="whatif-recorded")
                        yield SeriesPlot(
                            "loss with the change (log)", log=True, id="whatif-changed"
                        )
            with VerticalScroll(id="side"):
                yield Static(id="cursor-info")
                yield Static(id="run-info")

    def update_from_model(self) -> None:
        h = self.model.health
        steps = h.get("step", np.zeros(0, dtype=np.int64))
        marks = self.model.marks()
        kinds = {
            "snapshot": marks.snapshots,
            "skipped": marks.skipped,
            "exception": marks.exceptions,
            "symptom": [marks.symptom] if marks.symptom is not None else [],
            "first_bad": [marks.first_bad] if marks.first_bad is not None else [],
        }
        index_marks = {}
        for kind in ("first_bad", "symptom", "exception"):
            for s in kinds[kind]:
                i = int(np.searchsorted(steps, s))
                if i < len(steps) and steps[i] == s:
                    index_marks[i] = MARK_STYLES[kind][1]
        for key, _, _ in PLOTS:
            plot = self.query_one(f"#plot-{key}", SeriesPlot)
            values = h.get(key, np.zeros(0))
            plot.display = not (key == "scale" and not np.isfinite(values).any())
            plot.set_data(values, index_marks)
        self.query_one(MarkStrip).set_data(steps, kinds)
        if not hasattr(self, "_cursor_set") and len(steps):
            self._cursor_set = True
            focus = self.model.focus_step()
            self.cursor = int(np.searchsorted(steps, focus)) if focus is not None else 0
        self.cursor = min(getattr(self, "cursor", 0), max(0, len(steps) - 1))
        self._apply_cursor()
        self.query_one("#run-info", Static).update(self._run_info())

    # -- cursor --------------------------------------------------------------------------------

    def _apply_cursor(self) -> None:
        for plot in self.query(SeriesPlot):
            plot.cursor = self.cursor
        self.query_one(MarkStrip).cursor = self.cursor
        self.query_one("#cursor-info", Static).update(self._cursor_info())

    def action_move(self, delta: int) -> None:
        n = len(self.model.health.get("step", ()))
        if not n:
            return
        # one press moves one character column when there are more steps than columns
        cells = max(1, self.query_one(MarkStrip).content_size.width - 9)
        stride = max(1, -(-n // (cells * 2)) * 2) if n > cells else 1
        self.cursor = max(0, min(n - 1, self.cursor + delta * stride))
        self._apply_cursor()

    def action_jump(self, where: str) -> None:
        steps = self.model.health.get("step", np.zeros(0))
        if not len(steps):
            return
        if where == "first":
            self.cursor = 0
        elif where == "last":
            self.cursor = len(steps) - 1
        else:
            focus = self.model.focus_step()
            if focus is None:
                self.notify("no failure recorded in this run")
                return
            self.cursor = min(int(np.searchsorted(steps, focus)), len(steps) - 1)
        self._apply_cursor()

    def action_trace(self) -> None:
        """Trace the step under the cursor per op (``replay trace RUN --step N`` in a child
        process: the TUI itself imports no torch and runs no user code); the views fill in
        when the forensics file it writes appears."""
        steps = self.model.health.get("step", np.zeros(0))
        if not len(steps):
            return
        step = int(steps[min(self.cursor, len(steps) - 1)])
        files = ", ".join(sorted({str(e.get("path")) for e in self.model.entry.values()}))
        self.notify(f"tracing step {step}: replay trace imports {files}", timeout=6, markup=False)
        self._trace(step)

    @work(thread=True, exclusive=True, group="trace")
    def _trace(self, step: int) -> None:
        run = run_replay("trace", self.model.rec.path, "--step", str(step))
        if run.code != 0:
            self.app.call_from_thread(self._failed, run.error_line())
            return
        self.model.refresh()
        self.app.call_from_thread(self._traced, step)

    def _failed(self, line: str) -> None:
        """A child's one-line error: text from the file or the program, never markup."""
        self.notify(line, severity="error", timeout=10, markup=False)

    def _traced(self, step: int) -> None:
        self.update_from_model()
        self.notify(f"step {step} traced: views 2-6 show its ops")

    # -- what-if -------------------------------------------------------------------------------

    def action_whatif(self) -> None:
        """Ask for one change, then run ``replay whatif RUN --json CHANGE`` in a child process
        (it imports the recorded entry points; the TUI runs no user code) and plot its loss
        beside the recorded one."""

        def chosen(args: list[str] | None) -> None:
            if not args:
                return
            files = ", ".join(sorted({str(e.get("path")) for e in self.model.entry.values()}))
            said = f"what-if {' '.join(args)}: replay whatif imports {files}"
            self.notify(said, timeout=6, markup=False)
            self._whatif(args)

        self.app.push_screen(WhatIfForm(self.model.focus_step()), chosen)

    @work(thread=True, exclusive=True, group="whatif")
    def _whatif(self, args: list[str]) -> None:
        run = run_replay("whatif", self.model.rec.path, "--json", *args)
        report: WhatIfReport | None = None
        if run.code in (EXIT_OK, EXIT_NOTHING_FOUND):
            try:
                report = WhatIfReport.from_json(json.loads(run.stdout))
            except (ValueError, KeyError, TypeError, IndexError):
                report = None
        if report is None or not report.experiments:
            self.app.call_from_thread(self._failed, run.error_line())
            return
        self.app.call_from_thread(self._show_whatif, report)

    def _show_whatif(self, report: WhatIfReport) -> None:
        exp = report.experiments[0]
        steps = [s.step for s in report.recorded]
        recorded = _losses(report.recorded)
        by_step = {s.step: s for s in exp.steps}
        changed = _losses([by_step.get(t) for t in steps])
        both = np.concatenate([recorded, changed])
        with np.errstate(all="ignore"):
            logs = np.log10(both[np.isfinite(both) & (both > 0)])
        shared = (float(logs.min()), float(logs.max())) if logs.size else None
        span = f"steps {report.from_step}..{report.to_step}"
        for wid, values, title in (
            ("#whatif-recorded", recorded, f"loss as recorded, {span} (log)"),
            ("#whatif-changed", changed, f"with {exp.change}"),
        ):
            plot = self.query_one(wid, SeriesPlot)
            plot.shared_range = shared
            plot.border_title = title
            plot.set_data(values)
        if exp.removes_failure:
            line = Text(f"{exp.change} removes the failure", style="bold green")
            line.append(f" (no failure through step {report.to_step})", style="")
        elif exp.first_failure is not None:
            line = Text(f"{exp.change}: still fails", style="bold red")
            line.append(f" at step {exp.first_failure}", style="")
        else:
            line = Text(f"{exp.change}: no failure in these steps, nor as recorded")
        if not report.reproduces:
            line.append("  (the replay as recorded differs from the recording)", style="yellow")
        self.query_one("#whatif-verdict", Static).update(line)
        self.query_one("#whatif-panel").display = True

    # -- text panels ---------------------------------------------------------------------------

    def _every_lr(self, step: int) -> list[tuple[str, float]]:
        """Each param group's learning rate at ``step``, of every optimizer, when the run has
        more than one group (the health's ``lr`` is the first's); read from the step's record."""
        try:
            groups = step_hparams(self.model.rec, step)
        except (KeyError, RecordingError):  # no longer kept, or damaged: the plot's lr stays
            return []
        rows = [
            (f"{name}[{i}]", g.get("lr", float("nan")))
            for name, gs in groups.items()
            for i, g in enumerate(gs)
        ]
        return rows if len(rows) > 1 else []

    def _cursor_info(self) -> Text:
        h = self.model.health
        if not len(h.get("step", ())):
            return Text("no steps recorded yet", style="dim")
        i = self.cursor
        t = Text()
        t.append(f"step {int(h['step'][i])}\n", style="bold")
        keys = (("loss", "loss"), ("grad_norm", "grad norm"), ("lr", "lr"), ("scale", "scale"))
        rows = [(label, float(h[key][i])) for key, label in keys]
        rows = [(label, v) for label, v in rows if not (label == "scale" and np.isnan(v))]
        rows += [(f"lr {label}", v) for label, v in self._every_lr(int(h["step"][i]))]
        for label, v in rows:
            t.append(f"  {label:<10}", style="dim")
            t.append(fmt_num(v) + "\n", style="bold red" if not np.isfinite(v) else "")
        flags = [name for key, name in HEALTH_FLAGS if h[key][i] == 1]
        if flags:
            t.append("  " + ", ".join(flags) + "\n", style="bold red")
        return t

    def _run_info(self) -> Text:
        m, rec = self.model, self.model.rec
        meta = m.meta  # strings made safe for the terminal (tui/model.py)
        t = Text()
        t.append("run\n", style="bold underline")
        t.append(f"  {m.name}, {m.state_text()}\n")
        ended = rec.ended()  # the program died of an exception no step raised
        if ended is not None:
            t.append(f"  ended by {term_safe(ended.describe())}\n", style="bold red")
        t.append(f"  {m.status.get('steps_total', 0)} steps recorded\n")
        window = rec.replayable_window()
        t.append(
            f"  replayable {window.first}..{window.last}\n" if window else "  nothing replayable\n"
        )
        check = read_selfcheck(rec.path, rec.run_id)  # the background self-check (selfcheck.md)
        if check is not None:
            t.append(
                f"  self-check: {term_safe(check.short())}\n",
                style="bold red" if check.failed else ("green" if check.status == "ok" else "dim"),
            )
        model = meta.get("model", {})
        n_params = sum(p.numel for p in rec.run_meta.model.params)
        t.append(f"  model {model.get('class')} ({n_params:,} params)\n")
        opt = (meta.get("optimizer") or {}).get("class")
        sched = (meta.get("scheduler") or {}).get("class")
        scaler = " + GradScaler" if meta.get("scaler") else ""
        t.append(f"  optim {opt}" + (f" + {sched}" if sched else "") + f"{scaler}\n")
        env = m.env
        t.append(f"  torch {env.get('torch')}, {env.get('num_threads')} threads\n")
        t.append("entry points\n", style="bold underline")
        for role, e in m.entry.items():
            t.append(f"  {role} ", style="dim")
            t.append(f"{e.get('qualname')}\n    {shorten_path(e.get('path'), m.base)}\n")
        t.append("forensics\n", style="bold underline")
        if m.forensics is None:
            t.append("  " + m.no_forensics_message + "\n", style="yellow")
        else:
            v = m.forensics.verdict
            if v.kind == "none":  # a healthy step, traced with t or `replay trace`
                t.append(f"  step {v.step} traced: no op made a non-finite value\n")
            else:
                t.append(f"  step {v.step}: {v.kind}\n")
            if cause := cause_text(v):
                t.append(f"  {cause}\n")
            if v.op:
                word, _ = op_role(v, v.op_index, "producer")
                t.append(f"  {word}: {v.op} in {v.module or '(root)'}\n", style="bold red")
        t.append("marks\n", style="bold underline")
        t.append("  " + LEGEND.replace("  ", "\n  ") + "\n", style="dim")
        return t


def _losses(steps: Sequence[StepResult | None]) -> np.ndarray:
    """The ``loss`` of what-if steps as floats (NaN where none was measured)."""
    out = [np.nan if s is None or s.loss is None else s.loss for s in steps]
    return np.asarray(out, dtype=np.float64)

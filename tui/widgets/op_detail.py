"""``OpDetail``: one op: shapes, dtypes, statistics, a histogram of its output, its source line."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.text import Text
from textual.widgets import Static

from replay.reports import TraceVerdict
from replay.words import op_role, ran_at

from ..model import shorten_path
from .op_list import PHASE_SHORT, STATUS_GLYPHS
from .plot import fmt_num

__all__ = ["OpDetail", "histogram_rows", "split_location", "fmt_bytes"]

_BARS = " ▁▂▃▄▅▆▇█"


def histogram_rows(counts: list[float], height: int = 3) -> list[str]:
    """Bars of ``counts`` (one column each), ``height`` rows of eighth blocks, top row first."""
    c = np.asarray(counts, dtype=np.float64)
    peak = c.max() if c.size and np.isfinite(c).all() and c.max() > 0 else 0.0
    if peak == 0:
        return ["(no finite values)"]
    levels = np.ceil(c / peak * height * 8).astype(int)
    rows = []
    for r in range(height - 1, -1, -1):
        rows.append("".join(_BARS[max(0, min(8, lv - r * 8))] for lv in levels))
    return rows


def split_location(loc: str | None) -> tuple[str, int, str] | None:
    """``"file:line:function"`` -> ``(file, line, function)``."""
    if not loc:
        return None
    parts = loc.rsplit(":", 2)
    if len(parts) != 3 or not (parts[1].isascii() and parts[1].isdigit()):
        return None
    return parts[0], int(parts[1]), parts[2]


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class OpDetail(Static):
    """Attributes down: ``show(row, sources, base, verdict)`` with a row from
    ``ForensicsReader.op_row``; the op's part in the failure is worded as ``replay bisect``
    words it (``replay.words``)."""

    DEFAULT_CSS = "OpDetail { padding: 0 1; }"

    def show(
        self,
        row: dict[str, Any] | None,
        sources: dict[str, dict[int, str]],
        base: str,
        verdict: TraceVerdict | None = None,
    ) -> None:
        if row is None:
            self.update(Text("no op selected", style="dim"))
            return
        t = Text()
        phases = ("forward", "backward", "optimizer", "other")
        statuses = ("finite", "producer", "propagator", "raised", "exempt")
        p = phases.index(row["phase"]) if row["phase"] in phases else 3
        s = statuses.index(row["status"]) if row["status"] in statuses else 0
        glyph, gstyle = STATUS_GLYPHS[s]
        t.append(f"op {row['index']}  ", style="bold")
        t.append(f"{row['op']}\n", style="bold " + (gstyle if s else ""))
        t.append(f"{row['phase']}", style=PHASE_SHORT[p][1])
        word, why = op_role(verdict or TraceVerdict(), row["index"], row["status"])
        t.append(f"  {glyph} {word}\n", style=gstyle)
        if why:
            t.append(f"  {why}\n", style=gstyle or "dim")
        module = row.get("module")
        _field(t, "module", str(module) if module is not None else "(outside modules)")
        _field(t, "inputs", row.get("inputs") or "-")
        _field(t, "output", row.get("outputs") or "-")
        st = row.get("stats") or {}
        if st:
            _field(t, "min/max", f"{fmt_num(st['min'])} .. {fmt_num(st['max'])}")
            _field(t, "mean±std", f"{fmt_num(st['mean'])} ± {fmt_num(st['std'])}")
            _field(t, "absmax", fmt_num(st["absmax"]))
            bad = f"nan {int(st['nan'])}  +inf {int(st['posinf'])}  -inf {int(st['neginf'])}"
            _field(t, "non-fin", bad, "bold red" if st["nan"] + st["posinf"] + st["neginf"] else "")
            _field(t, "zeros", f"{int(st['zeros'])} of {int(st['numel'])}")
        hist = row.get("hist") or []
        if hist:
            t.append("  hist\n", style="dim")
            for line in histogram_rows(hist):
                t.append(f"    {line}\n", style="cyan")
        _field(t, "memory", fmt_bytes(row.get("mem_bytes", 0)) + " in use after")
        loc = split_location(row.get("source"))
        if loc:
            path, lineno, func = loc
            _field(t, "source", f"{shorten_path(path, base)}:{lineno} in {func}", "bold")
            code = sources.get(path, {}).get(lineno)
            if code is not None:
                t.append(f"    {code.strip()}\n", style="yellow")
        if verdict and verdict.op_index == row["index"] and (ran := ran_at(verdict)):
            where = f"{shorten_path(ran['file'], base)}:{ran['line']} in {ran['function']}"
            _field(t, "ran at", where, "bold")
            if ran["code"]:
                t.append(f"    {ran['code'].strip()}\n", style="yellow")
        self.update(t)


def _field(t: Text, name: str, value: str, style: str = "") -> None:
    t.append(f"  {name:<8} ", style="dim")
    t.append(f"{value}\n", style=style)

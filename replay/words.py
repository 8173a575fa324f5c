"""The words for an op's part in a failure, shared by ``replay bisect``'s report and the TUI's
op list, op detail and status line, so that each says the same thing about the same op.

No imports: the TUI uses it without torch, the bisector without HDF5. The reports are read
through :class:`Blame` (a ``replay.reports.TraceVerdict`` or ``BisectReport``).

- ``culprit``: the op the verdict names as the cause, a *producer* (it made a non-finite value
  out of finite inputs and arguments, or NaN out of infinities written on purpose);
- ``producer``: another op that made non-finite values which reached the loss, the gradients
  or the parameters;
- ``propagator``: an op that passed a non-finite value on; the one that turned the culprit's
  infinity into NaN says so;
- ``data``: the first op that read a non-finite input batch (the cause is the data, not it);
- ``exempt``: non-finite, but harmless (a mask's ``-inf``, an uninitialised buffer, a value
  that never reached the loss, gradients or parameters);
- ``raised``: the op raised the step's exception.

Example::

    op_role(verdict, 5, "producer")  # ("culprit", "the producer: made -inf from finite inputs")
"""

from __future__ import annotations

import math
from typing import Any, Protocol

__all__ = [
    "Blame",
    "op_role",
    "role_text",
    "cause_text",
    "samples_text",
    "ran_at",
    "fmt_num",
    "STATUS_WORDS",
]


class Blame(Protocol):
    """What the words read off a report that names an op: a ``TraceVerdict`` (the TUI) or a
    ``BisectReport`` (``replay bisect``), from ``replay.reports``."""

    @property
    def kind(self) -> str: ...
    @property
    def cause(self) -> str | None: ...
    @property
    def op(self) -> str | None: ...
    @property
    def op_index(self) -> int | None: ...
    @property
    def made(self) -> str | None: ...
    @property
    def made_from(self) -> str | None: ...
    @property
    def nan_from_inf(self) -> dict[str, Any] | None: ...
    @property
    def phase(self) -> str | None: ...
    @property
    def source(self) -> Any: ...  # ``SourceLine`` dicts, as ``executed_at``
    @property
    def executed_at(self) -> Any: ...


def ran_at(v: Blame) -> Any:
    """The line a custom ``autograd.Function``'s backward ran the op at ("ran at", under the
    forward line that made its node); ``None`` for a forward op or one of autograd's formulas."""
    ran = v.executed_at
    return ran if ran and v.phase == "backward" and ran != v.source else None


STATUS_WORDS = {  # status in the op table -> what it means
    "finite": "",
    "producer": "made non-finite values from finite inputs; they reached the failure",
    "propagator": "passed non-finite values on",
    "raised": "the step's exception came from here",
    "exempt": "non-finite but harmless (a mask, an uninitialised buffer, or it never reached "
    "the loss, the gradients or the parameters)",
}

_MADE = {"nan": "NaN", "posinf": "+inf", "neginf": "-inf"}


def _made(verdict: Blame) -> str:
    if verdict.made:
        return str(verdict.made)
    output = getattr(verdict, "output", None) or {}  # a TraceVerdict's
    st = output.get("stats") or {}
    made = [w for k, w in _MADE.items() if _count(st.get(k))]
    return "/".join(made) or "non-finite values"


def _count(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def _from(verdict: Blame) -> str:
    if verdict.made_from == "intentional":
        return "infinities written on purpose (a fully masked row?)"
    return "finite inputs"


def cause_text(verdict: Blame) -> str | None:
    """One line on what caused the failure, from the verdict's ``cause``."""
    cause = verdict.cause
    op = verdict.op
    if cause == "data":
        return "data: the input batch is non-finite: it is a data bug"
    if cause == "op":
        conv = verdict.nan_from_inf
        text = f"op: {op} made {_made(verdict)} from {_from(verdict)}"
        if conv:
            text += f"; {conv.get('op')} turned its {conv.get('from')} into NaN"
        return text
    if cause == "state":
        return "state: parameters or optimizer state were non-finite before this step"
    if cause == "intentional":
        return f"a value {op} wrote on purpose (a non-finite argument) reached the failure"
    if cause == "uninitialised":
        return f"uninitialised memory: {op} read a buffer nothing wrote"
    if cause == "compiled":
        return "compiled and eager replays disagree: the step fails compiled, not run eagerly"
    return None


def op_role(verdict: Blame, op_index: int | None, status: str) -> tuple[str, str]:
    """``(word, explanation)`` for op ``op_index`` whose status in the op table is ``status``
    (``finite``, ``producer``, ``propagator``, ``raised``, ``exempt``)."""
    conv = verdict.nan_from_inf or {}
    if op_index is not None and op_index == verdict.op_index:
        cause = verdict.cause
        if cause == "data":
            return "data", "the first op to read the non-finite input batch: a data bug"
        if verdict.kind == "exception":
            return "culprit", STATUS_WORDS["raised"]
        if cause == "op":
            return "culprit", f"the producer: made {_made(verdict)} from {_from(verdict)}"
        if cause == "state":
            return "culprit", "the first op to read state non-finite before the step"
        if cause == "intentional":
            return "culprit", "wrote a non-finite value on purpose that reached the failure"
        return "culprit", STATUS_WORDS.get(status, "")
    if op_index is not None and op_index == conv.get("op_index"):
        return (
            "propagator",
            f"turned the {conv.get('from')} of op {verdict.op_index} ({verdict.op}) into NaN",
        )
    return status, STATUS_WORDS.get(status, "")


def role_text(verdict: Blame, op_index: int | None, status: str) -> str:
    """``"culprit · the producer: made -inf from finite inputs"``."""
    word, why = op_role(verdict, op_index, status)
    return f"{word} · {why}" if why else word


class Samples(Protocol):
    """What :func:`samples_text` reads off a report that names culprit samples."""

    @property
    def samples(self) -> list[Any] | None: ...
    @property
    def samples_exact(self) -> bool | None: ...
    @property
    def sample_axes(self) -> list[int] | None: ...
    @property
    def sample_sources(self) -> list[dict[str, Any]] | None: ...


def samples_text(v: Samples) -> str:
    """The culprit samples as ``replay bisect`` and ``replay report`` word them: ``7``,
    ``3 (dataset index 37: rows/0037.row)``, ``along dim 1: 7``, ``[micro-batch, row] along dims
    0, 1: [2, 5]``; ``(approximate: ...)`` when batch-coupled layers made the search inexact."""
    samples = v.samples or []
    exact = "" if v.samples_exact is not False else " (approximate: batch-coupled layers)"
    axes = v.sample_axes or [0]
    if len(axes) > 1:
        what = f"[micro-batch, row] along dims {axes[0]}, {axes[1]}: "
        shown = ", ".join(f"[{m}, {r}]" for m, r in samples)
    else:
        what = f"along dim {axes[0]}: " if axes != [0] else ""
        shown = ", ".join(map(str, samples))
        sources = v.sample_sources
        if sources and len(sources) == len(samples):
            shown = ", ".join(
                f"{s} (dataset index {src.get('index')}"
                + (f": {src['file']}" if src.get("file") else "")
                + ")"
                for s, src in zip(samples, sources)
            )
    return f"{what}{shown}{exact}"


def fmt_num(v: float) -> str:
    """A measured number as the TUI and ``replay report``'s page both show it (four significant
    digits; scientific outside 1e-3..1e5), so that a number on one is the number on the other."""
    if not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.2e}"
    return f"{v:.4g}"

"""``TraceVerdict``: which op of a traced step is to blame, as ``docs/forensics.md`` ``/verdict``
documents it. The tracer builds it as JSON (``replay/trace/verdict.py``) and writes it into the
forensics sidecar; ``replay bisect``, ``replay trace`` and the TUI read it back through
:meth:`TraceVerdict.from_json`.

No imports beyond the standard library: the TUI reads it without torch.

Example::

    v = TraceVerdict.from_json(reader.verdict)
    v.kind, v.cause, v.op, v.module, v.source["line"] if v.source else None
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypedDict

__all__ = [
    "Ended",
    "ExceptionInfo",
    "OpRef",
    "SourceLine",
    "TraceVerdict",
    "exception_info",
    "known",
    "only_known",
]

JSONObject = dict[str, Any]  # a nested part of a report kept as its JSON
_ENDED_KINDS = ("exception", "interrupted", "exit", "killed")  # Ended.kind


class SourceLine(TypedDict):
    """A user source line, as the verdict names it: ``{"file", "line", "function", "code"}``."""

    file: str
    line: int
    function: str
    code: str  # the line's text, stripped ("" when it cannot be read)


class OpRef(TypedDict):
    """An op of the traced step as the verdict lists it (propagators, previous ops)."""

    op_index: int
    op: str
    phase: str
    module: str | None


class ExceptionInfo(TypedDict):
    """A step's exception as the reports name it."""

    type: str | None
    message: str | None


@dataclass(frozen=True)
class Ended:
    """``/ended``: the exception that ended the program outside any step (``record/ending.py``),
    after step ``last_step`` (``None``: before the first). ``kind``: ``exception``,
    ``interrupted`` (``KeyboardInterrupt``) or ``exit`` (``sys.exit`` with a failing status)."""

    kind: str
    type: str
    message: str
    where: str | None
    traceback: str
    last_step: int | None

    @classmethod
    def from_json(cls, v: Any) -> Ended | None:
        """``None`` for anything else: this part only informs, so a damaged one is no ending."""
        if not isinstance(v, dict) or v.get("kind") not in _ENDED_KINDS:
            return None
        tp, message, tb = (v.get(k) for k in ("type", "message", "traceback"))
        last, where = v.get("last_step"), v.get("where")
        if not (isinstance(tp, str) and isinstance(message, str) and isinstance(tb, str)):
            return None
        if not (last is None or (type(last) is int and last >= 0)):
            return None
        return cls(v["kind"], tp, message, where if isinstance(where, str) else None, tb, last)

    @classmethod
    def killed(cls, rows: list[dict[str, Any]]) -> Ended:
        """A recording left unclosed by a program that no exception ended, after its last
        health row of ``rows``; its message says how much memory the process held over them
        (the out-of-memory killer is the usual cause)."""
        last = int(rows[-1]["step"]) if rows else None
        return cls("killed", "", _memory(rows), None, "", last)

    @property
    def when(self) -> str:
        """``after step 11``, or ``before the first step``."""
        return "before the first step" if self.last_step is None else f"after step {self.last_step}"

    def describe(self) -> str:
        """``ValueError: corrupt sample, outside any step, after step 11, at train.py:14 in
        <module>`` (the message's first line; a DataLoader worker's exception, which the main
        process raises again with the worker's traceback as its message, by its last)."""
        after = self.when
        if self.kind == "killed":
            return (
                f"it never closed its recording, {after}: no exception ended it (a kill such as "
                "SIGKILL or the out-of-memory killer, os._exit, a crash in native code, the "
                "machine going down)" + (f"; {self.message}" if self.message else "")
            )
        lines = [line for line in self.message.splitlines() if line.strip()] or [""]
        first = lines[0]
        if len(lines) > 2 and lines[1].startswith("Original Traceback"):
            worker = first.removeprefix(f"Caught {self.type} in ").rstrip(".")
            first = f"{lines[-1].removeprefix(f'{self.type}: ')} (in {worker})"
        what = f"{self.type}: {first}" if first and self.kind != "interrupted" else self.type
        at = f", at {self.where}" if self.where else ""
        if self.kind == "interrupted":  # (a Ctrl-C lands between steps or inside one, unrecorded)
            return f"interrupted ({what}), {after}{at}"
        return f"{what}, outside any step, {after}{at}"


def _memory(rows: list[dict[str, Any]]) -> str:
    """The process's resident memory over the recorded steps, the GPU's where it had one."""
    said = []
    for col, what in (("rss", "resident memory"), ("cuda_allocated", "GPU memory allocated")):
        kept = [(int(r["step"]), r[col]) for r in rows if math.isfinite(r.get(col, math.nan))]
        if kept:
            (s0, v0), (s1, v1) = kept[0], kept[-1]
            said.append(f"{what} {v0 / 2**30:.2f} GiB at step {s0}, {v1 / 2**30:.2f} at {s1}")
    return "; ".join(said)


def exception_info(d: dict[str, Any] | None) -> ExceptionInfo | None:
    """The type and message of an exception as a report holds it (``None``: none)."""
    return None if d is None else ExceptionInfo(type=d.get("type"), message=d.get("message"))


def known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``d`` that are fields of the dataclass ``cls`` (a file written by another
    version may hold fewer or more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def only_known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """``d``, when every key is a field of the dataclass ``cls``; else a ``ValueError`` naming
    the others (a report built by this version: a key its type lacks would be lost)."""
    unknown = sorted(d.keys() - known(cls, d).keys())
    if unknown:
        raise ValueError(f"{cls.__name__} has no field for {', '.join(unknown)}")
    return d


@dataclass
class TraceVerdict:
    """The verdict of one traced step; every key of ``docs/forensics.md`` ``/verdict``, in its
    order. ``kind`` is ``"nonfinite"``, ``"exception"`` or ``"none"``; keys with no value are
    ``None`` (``[]`` for the lists)."""

    step: int | None = None
    kind: str = "none"
    cause: str | None = None  # op, data, state, intentional, uninitialised, compiled
    op_index: int | None = None
    op: str | None = None
    phase: str | None = None
    module: str | None = None  # "" for the root module
    source: SourceLine | None = None
    created_at: SourceLine | None = None
    executed_at: SourceLine | None = None
    autograd_node: str | None = None
    inputs: list[JSONObject] = field(default_factory=list)
    output: JSONObject | None = None  # shape, dtype, device, stats
    propagators: list[OpRef] = field(default_factory=list)
    previous: list[OpRef] = field(default_factory=list)
    exception: JSONObject | None = None  # type, message, op_index, source, traceback
    batch_nonfinite: JSONObject | None = None
    made: str | None = None  # NaN, +inf, -inf, NaN/-inf
    made_from: str | None = None  # finite, intentional
    nan_from_inf: JSONObject | None = None
    data: JSONObject | None = None  # tensors, sample_axes
    samples: list[Any] | None = None  # ints, or [micro-batch, row] pairs
    samples_exact: bool | None = None
    sample_axes: list[int] | None = None
    sample_layout: str | None = None  # rows, items, zipped, micro (trace.samples.sample_layout)
    # where each sample came from, for a batch drawn from a dataset by reference: its index
    # in the dataset and, when the dataset says, its file
    sample_sources: list[JSONObject] | None = None
    closure: int | None = None
    surfaced: JSONObject | None = None
    # bisect's finding at this step: two replays and the recording agree bitwise (None: not
    # known, as for a step `replay trace` traced)
    reproducible: bool | None = None
    sinks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The verdict as the sidecar's ``/verdict/json`` holds it."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TraceVerdict:
        """Read a verdict back (keys it lacks keep their defaults; unknown keys are dropped)."""
        return cls(**known(cls, d))

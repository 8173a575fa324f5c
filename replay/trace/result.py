"""``TraceResult``: what one traced step saw, as plain numbers, strings and numpy arrays."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from replay.store.forensics import OPS_COLUMNS, decode_op, write_forensics

if TYPE_CHECKING:  # their modules import torch; this one is read without it
    from replay.reports.verdict import SourceLine
    from replay.trace.memory import MemoryPicture
    from replay.trace.picture import BatchPicture
    from replay.trace.source import SourceFile

__all__ = ["TraceResult", "TraceException"]


class TraceException(TypedDict):
    """The traced step's exception (the verdict's ``exception``)."""

    type: str
    message: str
    op_index: int | None  # the op being dispatched when it raised; None: raised in Python
    source: SourceLine | None  # the innermost user line of its traceback
    traceback: str


@dataclass
class TraceResult:
    """The op table (columns per ``docs/forensics.md``), the verdict and the step's picture.

    Example::

        r = trace_step(model, opt, train_step, batch)
        r.verdict["kind"], r.verdict["op"], r.op_row(r.verdict["op_index"])
        r.write("run.forensics.h5", run_id="abc", step=123)
    """

    verdict: dict[str, Any]  # a JSON document: docs/forensics.md, /verdict
    ops: Mapping[str, np.ndarray]  # an OpColumns when traced: read whole on first use
    strings: dict[str, list[str]]
    modules: dict[str, np.ndarray]
    params: dict[str, np.ndarray]
    memory: MemoryPicture
    sources: dict[str, SourceFile]
    batch: BatchPicture
    loss: float | None = None
    exception: TraceException | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def n_ops(self) -> int:
        rows = getattr(self.ops, "rows", None)
        return int(rows) if rows is not None else len(self.ops["phase"])

    def op_row(self, i: int) -> dict[str, Any]:
        """One op with its strings decoded (the same shape as ``ForensicsReader.op_row``)."""
        read = getattr(self.ops, "read", None)
        c = (
            {k: read(k, i, i + 1)[0] for k in self.ops}
            if read is not None
            else {k: v[i] for k, v in self.ops.items()}
        )
        return decode_op(i, c, self.strings.__getitem__)

    def set_samples(
        self, samples: Sequence[Any], exact: bool, axes: Sequence[int] | None = None
    ) -> None:
        """Record the culprit samples: positions along the sample axis ``axes[0]`` (default
        dim 0), or ``[micro-batch, row]`` pairs when ``axes`` names two (micro-batches)."""
        axes = [0] if axes is None else [int(a) for a in axes]
        norm: list[int] | list[list[int]] = (
            [int(s) for s in samples] if len(axes) == 1 else [[int(i) for i in s] for s in samples]
        )
        self.verdict.update(samples=norm, samples_exact=bool(exact), sample_axes=axes)
        if self.verdict.get("data") is not None:
            self.verdict["data"]["sample_axes"] = axes
        # the batch picture is per dim-0 sample: it marks culprits only when those are samples
        self.batch["culprits"] = norm if axes == [0] else []

    def add_notes(self, notes: list[str]) -> None:
        self.verdict.setdefault("notes", []).extend(notes)

    def to_tables(self, step: int | None = None) -> dict[str, Any]:
        """What ``replay.store.forensics.write_forensics`` takes."""
        verdict = dict(self.verdict)
        if step is not None:
            verdict["step"] = int(step)
        modules = {k: v for k, v in self.modules.items() if k != "names"}
        params = {k: v for k, v in self.params.items() if k != "names"}
        params["name"] = np.arange(len(self.strings["params"]), dtype=np.int32)
        # an OpColumns is written in row ranges, never read whole
        ops = self.ops if hasattr(self.ops, "read") else {k: self.ops[k] for k in OPS_COLUMNS}
        return {
            "verdict": verdict,
            "ops": ops,
            "strings": self.strings,
            "modules": modules,
            "params": params,
            "memory": self.memory,
            "sources": self.sources,
            "batch": self.batch,
        }

    def write(self, path: str | os.PathLike[str], run_id: str, step: int) -> None:
        write_forensics(path, run_id=run_id, step=step, tables=self.to_tables(step))

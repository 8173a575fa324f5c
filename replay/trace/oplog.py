"""The log of op rows: one row per op (``OpSpool``, streamed to files as it grows: a step of
millions of ops is traced in bounded memory), its outputs measured (``stats.py``; small finite
ones staged and measured in batches, ``staged.py``), the memory the step holds after it
(``memory.py``), and the string tables its columns index.

NB: ``measure`` runs with the tracer's modes off: the tensors it touches are neither traced nor
tagged.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch._ops import OpOverload

from replay.trace.memory import MemoryTracker
from replay.trace.origins import storage_key
from replay.trace.rules import OpInfo, op_info
from replay.trace.sites import OpSite
from replay.trace.source import Interner
from replay.trace.spool import OpSpool
from replay.trace.staged import STAGE_MAX, Stage, quick_finite
from replay.trace.stats import (
    NO_HIST,
    NO_STATS,
    Stats,
    copy_small,
    finite_kind,
    floating,
    kind_of_row,
    np_stats,
    tensor_stats,
)

__all__ = ["OpLog", "PROGRESS_ROWS", "NO_HIST"]

PROGRESS_ROWS = 1 << 12  # ops between two progress calls (and checks of the spool's buffer)
SINGLE_THREAD_NUMEL = 1 << 20
_ShapeKey = tuple[tuple[torch.dtype, torch.Size, int], ...]  # int: get_device(), -1 the CPU
#: What ``measure`` found: the statistics row and histogram of the op's main output, the kinds
#: of its floating outputs (``finite_kind``), those outputs, its values to stage (or None) and
#: a staged row holding the same values (-1: none).
Measured = tuple[Stats, np.ndarray, list[str], list[torch.Tensor], np.ndarray | None, int]


def _kind(t: torch.Tensor) -> str:
    """``finite_kind``, with one sum over a small tensor's copy when that says finite."""
    a = copy_small(t)
    return "finite" if a is not None and quick_finite(a) else finite_kind(t)


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype)[6:]}[{','.join(map(str, t.shape))}]@{t.device}"


def _torch_stats(t: torch.Tensor) -> tuple[Stats, np.ndarray]:
    """``tensor_stats`` of a tensor numpy does not measure (large, on a GPU, not float).
    Small reductions are latency-bound: an OpenMP fork/join per reduction costs more than
    the work (and ms on a busy machine), so they run on one thread, restored after."""
    threads = torch.get_num_threads()
    single = threads > 1 and t.numel() < SINGLE_THREAD_NUMEL
    if single:
        torch.set_num_threads(1)
    try:
        return tensor_stats(t)
    finally:
        if single:
            torch.set_num_threads(threads)


class OpLog:
    def __init__(self, cuda: bool) -> None:
        self.cols = OpSpool()
        self.op_names = Interner()
        self.shapes = Interner()
        self.memory = MemoryTracker(cuda)
        # statistics of small finite outputs, measured in batches and written into their rows
        # before the rows leave the spool's buffer
        self.stage = Stage(self._write_staged, self._copy_staged)
        self.progress: Callable[[], None] | None = None  # told every PROGRESS_ROWS ops
        self._ops: dict[OpOverload[..., object], OpInfo] = {}
        self._shape_key: dict[_ShapeKey, int] = {}
        # Staged values seen in each storage, by storage key and data pointer: (numel, version,
        # dtype, row). An op that only re-views those values (``OpRule.alias``: ``t()`` of a
        # weight at every step of an unrolled RNN) gets that row's statistics. A mutation bumps
        # the version (and drops the entry: ``.data`` has a version of its own); a storage let
        # go (the memory tracker's count of its tensors fell to 0) drops it too, before its
        # address can be reused.
        self._values: dict[int, dict[int, tuple[int, int, torch.dtype, int]]] = {}
        self.memory.on_free = lambda key: self._values.pop(key, None)

    def __len__(self) -> int:
        return len(self.cols)

    def name(self, row: int) -> str:
        """The name of the op of row ``row``."""
        return self.op_names.items[int(self.cols["name"][row])]

    def op(self, func: OpOverload[..., object]) -> OpInfo:
        info = self._ops.get(func)
        if info is None:
            info = self._ops[func] = op_info(func, self.op_names)
        return info

    def shapes_of(self, ts: list[torch.Tensor]) -> int:
        key = tuple([(t.dtype, t.shape, t.get_device()) for t in ts])
        i = self._shape_key.get(key)
        if i is None:
            i = self._shape_key[key] = self.shapes(", ".join(_describe(t) for t in ts))
        return i

    def mutating(self, mutated: list[object]) -> None:
        """An op is about to write to ``mutated``: values measured in them are no longer."""
        if self._values:
            for m in mutated:
                if isinstance(m, torch.Tensor) and (k := storage_key(m)) is not None:
                    self._values.pop(k, None)

    def append(
        self,
        site: OpSite,
        status: int,
        inputs: int,
        outputs: int,
        row: Stats,
        hist: np.ndarray,
        elapsed: int,
        staged: np.ndarray | None = None,
        alias: int = -1,
    ) -> None:
        """One row: ``inputs``/``outputs`` index the shapes table (-1: none). ``staged``: the
        finite values of its output, measured later in a batch; ``alias``: a staged row holding
        the same values (``row`` and ``hist`` are placeholders until then)."""
        spool = self.cols
        c = spool.buf
        c["phase"].append(site.phase)
        c["name"].append(site.op.index)
        c["module"].append(site.module)
        c["source"].append(site.location)
        c["stack"].append(site.stack)
        c["node"].append(site.node)
        c["status"].append(status)
        c["inputs"].append(inputs)
        c["outputs"].append(outputs)
        c["time_ns"].append(elapsed)
        c["closure"].append(site.closure)
        c["stats"].append(row)
        c["hist"].append(hist)
        c["mem_bytes"].append(self.memory.after_op(site.index))
        if staged is not None:
            self.stage.add(site.index, staged)
        elif alias >= 0:
            self.stage.alias(site.index, alias)
        if not (site.index + 1) % PROGRESS_ROWS:
            if spool.full():
                self.stage.flush()  # the staged rows get their statistics before they go
                spool.flush()
            if self.progress is not None:
                self.progress()

    def measure(self, site: OpSite, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> Measured:
        """Count the op's tensors in memory and measure its outputs."""
        see, seen = self.memory.see, self.memory.seen
        for ts in (ins, outs):
            for t in ts:
                if id(t) not in seen:
                    see(t, site.index, site.op.name)
        floats = [t for t in outs if floating(t)]
        main = floats[0] if floats else (outs[0] if outs else None)
        staged: np.ndarray | None = None
        alias = -1
        a = None
        src: torch.Tensor | None = None
        if main is not None and site.op.rule.alias and ins and len(floats) == 1:
            src = ins[0]
            if src.numel() == main.numel() and src.dtype == main.dtype:
                alias = self._measured(src)
            else:
                src = None
        if alias < 0 and main is not None:
            a = copy_small(main)
        if alias >= 0:  # the same values as a row measured before: its statistics
            row, hist, kinds = NO_STATS, NO_HIST, ["finite"]
        elif a is not None and quick_finite(a):
            if a.size <= STAGE_MAX:
                staged, row, hist = a, NO_STATS, NO_HIST  # measured later, in a batch
            else:  # enough values that numpy's per-call cost does not matter
                row, hist = np_stats(a, True)
            kinds = ["finite"]
            # A view's version counter is joined to its base's only after the op returns:
            # the values are remembered under the viewed input
            remembered = src if src is not None else main
            assert remembered is not None
            self._remember(remembered, site.index)
        elif a is not None:
            row, hist = np_stats(a, True)
            kinds = [kind_of_row(row)]
        elif main is not None:
            row, hist = _torch_stats(main)
            kinds = [kind_of_row(row)] if floats else []
        else:
            row, hist, kinds = NO_STATS, NO_HIST, []
        if len(floats) > 1:
            kinds += [_kind(t) for t in floats[1:]]
        return row, hist, kinds, floats, staged, alias

    def _remember(self, t: torch.Tensor, row: int) -> None:
        """``t``'s values are measured in row ``row`` (finite: staged, or measured at once), if
        the memory tracker counts ``t``: its storage's entry goes when the storage is let go."""
        key = storage_key(t)
        # An inference tensor (made under torch.inference_mode()) has no version counter: an
        # in-place change to it would not show, so its values are never taken as measured.
        if key is not None and self.memory.counts(key) and not t.is_inference():
            at = self._values.setdefault(key, {})
            at[t.data_ptr()] = (t.numel(), t._version, t.dtype, row)

    def _measured(self, t: torch.Tensor) -> int:
        """The row of finite values measured that ``t`` holds now, else -1."""
        key = storage_key(t)
        at = self._values.get(key) if key is not None and not t.is_inference() else None
        v = at.get(t.data_ptr()) if at is not None else None
        if v is not None and v[0] == t.numel() and v[1] == t._version and v[2] == t.dtype:
            return v[3]
        return -1

    def _copy_staged(self, row: int, src: int) -> None:
        buf, first = self.cols.buf, self.cols.flushed
        buf["stats"][row - first] = self.cols.get("stats", src)
        buf["hist"][row - first] = self.cols.get("hist", src)

    def _write_staged(self, rows: list[int], stats: np.ndarray, hists: np.ndarray) -> None:
        """The batch-measured statistics of staged rows, into the spool's buffer (they are
        still there: the stage is flushed before the spool)."""
        buf, first = self.cols.buf, self.cols.flushed
        st, hs = buf["stats"], buf["hist"]
        for j, r in enumerate(rows):
            st[r - first] = stats[j]
            hs[r - first] = hists[j]

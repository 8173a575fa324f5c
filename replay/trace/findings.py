"""What a traced step's non-finite values and failing ops tell: each non-finite op classified
by where its values came from (``origins.py``), the ops that raised, and the non-finite values
the step looked at besides the sinks ``step.py`` checks (``Noticed``): a backward started from
one (each closure call's loss), a Python number read off one (``.item()``, ``float()``: LBFGS
compares losses that way). The verdict looks for the first producer over all of them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypedDict

import torch
from torch.utils._pytree import tree_flatten

from replay.store.contracts import OpStatus
from replay.trace.origins import Origins, Storages
from replay.trace.sites import OpSite
from replay.trace.spool import NonFiniteTable
from replay.trace.stats import finite_kind, floating, tensor_stats

__all__ = ["Findings", "NonFinite", "Noticed", "RaisedOp", "TensorInfo", "InputInfo", "STATUS"]

MAX_DETAILED = 64  # non-finite ops whose inputs get full statistics
_FINITE, _PRODUCER, _PROPAGATOR, _RAISED, _EXEMPT = (s.code for s in OpStatus)
#: The status column's code of each role (a converter is a propagator there).
STATUS = {"producer": _PRODUCER, "converter": _PROPAGATOR, "propagator": _PROPAGATOR}
STATUS.update(exempt=_EXEMPT, finite=_FINITE, raised=_RAISED)


class TensorInfo(TypedDict):
    """A tensor named in the verdict: ``{"shape", "dtype" (float32), "device"}``."""

    shape: list[int]
    dtype: str
    device: str


class InputInfo(TensorInfo, total=False):
    """A failing op's input, with its statistics (``STATS_COLUMNS``) unless it is too large."""

    stats: dict[str, float]


@dataclass(slots=True)
class NonFinite:
    """What the tracer knows about an op whose output was not finite."""

    role: str  # producer | converter | propagator | exempt (see origins.py)
    klass: str
    origins: frozenset[int]
    output: TensorInfo | None = None  # its first floating output (None unless ``detailed``)
    # Filled for the first MAX_DETAILED of them, and for every producer (``detailed``): the
    # inputs with their statistics, and the location of the code that ran the op.
    inputs: list[InputInfo] = field(default_factory=list)
    executed_at: int = -1
    detailed: bool = False


@dataclass(frozen=True)
class Noticed:
    """A non-finite value that something in the step looked at: ``what`` ("the loss of a
    backward", "a Python number read by .item()"), ``index``: the op row at which it was seen
    (the next op's, for a backward's root), ``origins``: where its values came from."""

    what: str
    index: int
    origins: frozenset[int]


@dataclass
class RaisedOp:
    """An op that raised: its row, the exception (set to None once the verdict is built: its
    traceback holds the step's frames), its inputs and the location of the code that ran it."""

    index: int
    exc: BaseException | None
    inputs: list[InputInfo]
    executed_at: int
    bad_origins: frozenset[int] = frozenset()  # origins of its non-finite inputs, if any


def _arg_kind(args: object) -> str:
    """The non-tensor arguments' kind, as ``finite_kind`` says for tensors: a fill value of
    ``-inf`` is "neginf", one of NaN "nan"."""
    kind = "finite"
    for a in tree_flatten(args)[0]:
        if isinstance(a, float) and not math.isfinite(a):
            if a != a:
                return "nan"
            kind = "inf" if a > 0 or kind == "inf" else "neginf"
    return kind


def _tensor_info(t: torch.Tensor) -> TensorInfo:
    return {"shape": list(t.shape), "dtype": str(t.dtype)[6:], "device": str(t.device)}


def input_info(t: torch.Tensor) -> InputInfo:
    d: InputInfo = {"shape": list(t.shape), "dtype": str(t.dtype)[6:], "device": str(t.device)}
    if t.numel() <= 1 << 24:
        row, _ = tensor_stats(t, hist=False)
        d["stats"] = row._asdict()
    return d


class Findings:
    def __init__(self, batch_keys: Storages, present_keys: Storages, mask_keys: Storages) -> None:
        self.origins = Origins()
        self.origins.batch_keys = batch_keys
        self.origins.present_keys = present_keys
        self.origins.mask_keys = mask_keys
        # every non-finite op, a few bytes each (spool.NonFiniteTable); full records for the
        # first MAX_DETAILED and every producer
        self.nonfinite = NonFiniteTable(NonFinite)
        self.raised: list[RaisedOp] = []
        self.noticed: list[Noticed] = []
        self._sets: dict[frozenset[int], frozenset[int]] = {}

    def pre_bad(self, mutated: list[object]) -> dict[int, bool]:
        """Whether each tensor an op is about to write to holds values known non-finite."""
        if not self.origins.by_storage:
            return {}
        return {id(t): self.origins.known_bad(t) for t in mutated if isinstance(t, torch.Tensor)}

    def notice(self, t: torch.Tensor, what: str, at: int, closure: int) -> None:
        """Record that the step looked at ``t`` (``Noticed``) if it holds NaN/Inf."""
        if not floating(t) or finite_kind(t) == "finite":
            return
        if closure >= 0:
            what += f" in closure call {closure}"
        self.noticed.append(Noticed(what, at, self.origins.of(t)))

    def classify(
        self,
        site: OpSite,
        call: tuple[tuple[object, ...], dict[str, object]],
        ins: list[torch.Tensor],
        mutated: list[object],
        pre_bad: dict[int, bool],
        floats: list[torch.Tensor],
        kinds: list[str],
    ) -> NonFinite:
        """Classify an op whose floating outputs ``floats`` (of ``kinds``) are not all finite,
        and record the origins its outputs carry (``origins.py``)."""
        out_kind = "nan" if "nan" in kinds else "inf" if "inf" in kinds else "neginf"
        mutated_ids = {id(t) for t in mutated}
        checked: list[tuple[torch.Tensor, str]] = []
        for t in filter(floating, ins):
            if id(t) in mutated_ids:
                k = "nan" if pre_bad.get(id(t)) else "finite"  # its value before the op
            else:
                k = finite_kind(t)
            checked.append((t, k))
        role, klass, origins = self.origins.classify(
            site.index, site.op.name, checked, out_kind, _arg_kind(call)
        )
        # one object per distinct set: after a step turns NaN every op carries the same few
        origins = self._sets.setdefault(origins, origins)
        for t, k in zip(floats, kinds):
            self.origins.set_output(t, origins if k != "finite" else None)
        nf = NonFinite(role, klass, origins)
        if len(self.nonfinite) < MAX_DETAILED or role == "producer":
            nf.output = _tensor_info(floats[0])
            nf.inputs = [input_info(t) for t in ins]
            nf.detailed = True
        self.nonfinite.add(site.index, role, klass, origins, nf if nf.detailed else None)
        return nf

    def finite(self, floats: list[torch.Tensor]) -> None:
        """An op's floating outputs are finite: their storages forget their origins."""
        if self.origins.by_storage:
            for t in floats:
                self.origins.set_output(t, None)

    def raised_op(self, index: int, exc: BaseException, ins: list[torch.Tensor], at: int) -> None:
        """An op that raised (``at``: the location of the code that ran it)."""
        inputs = [input_info(t) for t in ins]
        bad = [t for t in ins if floating(t) and finite_kind(t) != "finite"]
        origins: frozenset[int] = frozenset().union(*(self.origins.of(t) for t in bad))
        self.raised.append(RaisedOp(index, exc, inputs, at, origins))

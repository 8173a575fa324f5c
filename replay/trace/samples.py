"""Which samples of a batch make the step fail: delta debugging along the sample axis.

The sample axis need not be dim 0 (time-major ``[T, B]`` batches, micro-batches ``[M, B, ...]``):
``choose_sample_axes`` finds it with a few replays (see its docstring). The caller supplies
``fails(indices)``, which restores the state and replays the step on just those samples
(``slice_batch(batch, indices, axis)``). ``find_culprit_samples`` returns a 1-minimal set (ddmin, Zeller
and Hildebrandt 2002): removing any single sample makes the failure go away. With batch-coupled
layers (BatchNorm in training mode) a sub-batch changes every sample's computation, so the answer
is approximate (``exact`` is False).

Every tensor of the batch is cut along its own sample axis: the leaves that hold samples along
``axis``, and also targets flattened from the leading dims of the others (``targets.view(-1)`` of
a time-major ``[T, B]`` batch has length T*B: ``_flat_size``). A sub-batch counts as failing
only when it fails the same way as the whole batch (``Failure``: the same kind, the same op, the
same exception type): a sub-batch that breaks differently says the cut was wrong, not that the
samples left out were to blame.

Example::

    idx, exact = find_culprit_samples(lambda ix: replay_fails(slice_batch(batch, ix)),
                                      batch_size_of(batch), coupled=has_batch_coupling(model))
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import torch
import torch.nn.functional as F
from torch._ops import OpOverload
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from replay.store.tree import map_tree
from replay.trace.picture import batch_leaves
from replay.trace.rules import ALLOC_OPS
from replay.trace.stats import floating

__all__ = [
    "Failure",
    "FailureProbe",
    "find_culprit_samples",
    "slice_batch",
    "batch_size_of",
    "has_batch_coupling",
    "candidate_axes",
    "choose_sample_axes",
    "sample_layout",
    "permute_batch",
    "no_dropout",
    "hinted_axes",
    "sample_list",
]

REL_TOL = 1e-4  # a loss unchanged by permuting samples, up to the order of float sums
_Batch = TypeVar("_Batch")


def _flat_size(t: torch.Tensor, others: list[torch.Tensor]) -> tuple[int, ...] | None:
    """The leading shape of another leaf that ``t``'s dim 0 flattens (``[T*B]`` from ``[T, B]``),
    or None."""
    for u in others:
        for k in range(2, u.dim() + 1):
            lead = tuple(u.shape[:k])
            if t.shape[0] == math.prod(lead) and t.shape[0] != u.shape[0]:
                return lead
    return None


def _per_sample_leaves(batch: object) -> list[torch.Tensor]:
    """The leaves that hold samples: those whose dim 0 has the most common dim-0 size, leaving
    out targets flattened from the others (``_flat_size``)."""
    leaves = [t for _, t in batch_leaves(batch) if t.dim() >= 1]
    flat = {id(t) for t in leaves if _flat_size(t, [u for u in leaves if u is not t])}
    leaves = [t for t in leaves if id(t) not in flat] or leaves
    sizes = Counter(t.shape[0] for t in leaves)
    if not sizes:
        return []
    size = sizes.most_common(1)[0][0]
    return [t for t in leaves if t.shape[0] == size]


def sample_list(batch: object) -> bool:
    """The batch is a list (or plain tuple) of samples, each a container of its own tensors: a
    DQN minibatch of transitions (``random.sample(memory, n)``: namedtuples of ``[1, 4]``
    states, actions, rewards), a list of dicts collated inside the step. Its sample axis is
    the list itself. Not ``[x, y]`` (tensors), nor a list of micro-batches (containers whose
    tensors share a leading size over 1: the rows of each are samples)."""
    if not isinstance(batch, (list, tuple)) or type(batch) not in (list, tuple) or len(batch) < 2:
        return False
    first = batch[0]
    if not isinstance(first, (tuple, list, dict)) or any(type(b) is not type(first) for b in batch):
        return False
    for item in batch[:4]:
        leaves = [t for _, t in batch_leaves(item)]
        if not leaves:
            return False
        rows = {t.shape[0] if t.dim() else 1 for t in leaves}
        if len(rows) == 1 and rows.pop() > 1:
            return False  # a micro-batch of rows
    return True


def micro_list(batch: object, least: int = 2) -> bool:
    """The batch is a list (or plain tuple) of at least ``least`` micro-batches: containers of
    the same type whose tensors share a leading size over 1 (open_clip's ``--accum-freq``
    batches handed over as one step). Axis 0 is then the list, axis 1 each one's rows."""
    items = cast(list[object], batch)  # (when it is a list or a tuple)
    if type(batch) not in (list, tuple) or len(items) < least:
        return False
    first = items[0]
    if not isinstance(first, (tuple, list, dict)) or any(type(b) is not type(first) for b in items):
        return False
    shape = None  # micro-batches hold the same tensors (not images beside their targets)
    for item in items[:4]:
        found = batch_leaves(item)
        rows = {t.shape[0] if t.dim() else 1 for _, t in found}
        if len(rows) != 1 or rows.pop() < 2 or shape not in (None, [p for p, _ in found]):
            return False
        shape = [p for p, _ in found]
    return True


def zipped(batch: object) -> bool:
    """The batch is a tuple (or list) of per-sample sequences of one length N >= 2, beside
    tensors of N rows if any: torchvision detection's ``collate_fn`` (``tuple(zip(*batch))``:
    images of their own sizes, and a dict of targets each). Its samples are the positions in
    those sequences (not the rows of the tensors inside them: an image's channels)."""
    if type(batch) not in (list, tuple) or micro_list(batch):
        return False
    items = cast(list[object], batch)
    seqs = [x for x in items if type(x) in (list, tuple)]
    if not seqs or len(seqs) + sum(isinstance(x, torch.Tensor) for x in items) != len(items):
        return False
    n = len(cast(list[object], seqs[0]))
    rows = [x.shape[0] if x.dim() else 0 for x in items if isinstance(x, torch.Tensor)]
    return n >= 2 and all(len(cast(list[object], x)) == n for x in seqs) and set(rows) <= {n}


def sample_layout(batch: object, axes: Sequence[int]) -> str:
    """How the samples along ``axes`` index the tree of ``batch`` (the TUI marks them so):
    ``micro`` (``[micro-batch, row]`` pairs of a ``micro_list``), ``items`` (a ``sample_list``'s
    items), ``zipped`` (positions in its sequences), else ``rows`` (that dim of its tensors)."""
    if len(axes) == 2 and micro_list(batch, least=1):
        return "micro"
    if list(axes) == [0] and sample_list(batch):
        return "items"
    return "zipped" if list(axes) == [0] and zipped(batch) else "rows"


def _pick(part: object, indices: Sequence[int]) -> object:
    """Positions ``indices`` of one part of a ``zipped`` batch (a sequence, or a tensor)."""
    if isinstance(part, torch.Tensor):
        return part.index_select(0, torch.as_tensor(list(indices), device=part.device))
    items = cast(list[object], part)
    return type(items)(items[i] for i in indices)


def batch_size_of(batch: object, axis: int = 0) -> int | None:
    """The size of ``axis`` in the batch: by default the most common dim-0 size among the
    tensor leaves (None without any); the list's length for a ``sample_list``; for a
    ``micro_list``, the list's length along 0 and the first micro-batch's rows along 1."""
    items = cast(list[object], batch)  # (when it is a list or a tuple)
    if axis == 0 and sample_list(batch):
        return len(items)
    if axis == 0 and zipped(batch):  # (its sequences are lists or tuples, the rest tensors)
        return len(next(x for x in items if isinstance(x, (list, tuple))))
    if micro_list(batch, least=1):
        return len(items) if axis == 0 else batch_size_of(items[0]) if axis == 1 else None
    if axis == 0:
        leaves = _per_sample_leaves(batch)
        return leaves[0].shape[0] if leaves else None
    return dict(candidate_axes(batch)).get(axis)


def candidate_axes(batch: object) -> list[tuple[int, int]]:
    """``(axis, size)`` of every dimension that could index samples: dim 0 as ``batch_size_of``
    says, and each further dimension that every per-sample leaf has, with one size > 1.

    ``x[B, F], y[B]`` gives ``[(0, B)]``; time-major ``x[T, B], y[T, B]`` gives
    ``[(0, T), (1, B)]``; micro-batches ``x[M, B, T], y[M, B]`` give ``[(0, M), (1, B)]``; a
    ``sample_list`` of N samples gives ``[(0, N)]``: its samples are its items.
    """
    if sample_list(batch) or zipped(batch):
        return [(0, batch_size_of(batch) or 0)]
    if micro_list(batch):
        return [(0, len(cast(list[object], batch))), (1, batch_size_of(batch, 1) or 0)]
    leaves = _per_sample_leaves(batch)
    if not leaves:
        return []
    out = [(0, leaves[0].shape[0])]
    for d in range(1, min(t.dim() for t in leaves)):
        sizes = {t.shape[d] for t in leaves}
        if len(sizes) == 1 and (size := sizes.pop()) > 1:
            out.append((d, size))
    return out


def slice_batch(batch: _Batch, indices: Sequence[int], axis: int = 0) -> _Batch:
    """The same nested structure (dict, list, tuple, namedtuple) with every tensor leaf whose
    ``axis`` has the batch's size along it indexed by ``indices`` there; other leaves are kept
    as they are. A ``sample_list``: those of its items."""
    items = cast(list[object], batch)  # (when it is a list or a tuple)
    if axis == 0 and sample_list(batch):
        return cast(_Batch, type(items)(items[i] for i in indices))
    if axis == 0 and zipped(batch):
        return cast(_Batch, type(items)(_pick(part, indices) for part in items))
    if micro_list(batch, least=1) and axis in (0, 1):
        if axis == 0:
            return cast(_Batch, type(items)(items[i] for i in indices))
        return cast(_Batch, type(items)(slice_batch(item, indices) for item in items))
    size = batch_size_of(batch, axis)
    leaves = _per_sample_leaves(batch)
    ref = tuple(leaves[0].shape) if leaves else ()
    take = list(indices)
    # each container rebuilt as it was (a mapping: a dict): the result has the batch's type
    return cast(_Batch, map_tree(lambda t: _take(t, take, axis, size, ref), batch))


def permute_batch(batch: _Batch, axis: int) -> _Batch:
    """The batch with the order of its samples along ``axis`` reversed."""
    size = batch_size_of(batch, axis)
    return slice_batch(batch, list(range(size - 1, -1, -1)), axis) if size else batch


def _take(
    x: object, indices: list[int], axis: int, size: int | None, ref: tuple[int, ...] = ()
) -> object:
    if size is None or not isinstance(x, torch.Tensor):
        return x
    ix = torch.as_tensor(indices, dtype=torch.long, device=x.device)
    if x.dim() > axis and x.shape[axis] == size:
        return x.index_select(axis, ix)
    # flattened from the leading dims of the per-sample leaves (targets.view(-1) of [T, B]):
    # cut along the same axis of those dims, then flatten again
    for k in range(max(2, axis + 1), len(ref) + 1):
        lead = ref[:k]
        if x.dim() >= 1 and x.shape[0] == math.prod(lead) and lead[axis] == size:
            full = x.reshape(*lead, *x.shape[1:]).index_select(axis, ix)
            return full.reshape(-1, *x.shape[1:])
    if 0 < x.dim() <= axis and x.shape[0] == size:
        return x.index_select(0, ix)  # one value per sample (lengths [B] of a [T, B] batch)
    return x


_DROPOUTS = frozenset(
    {
        F.dropout,
        F.dropout1d,
        F.dropout2d,
        F.dropout3d,
        F.alpha_dropout,
        F.feature_alpha_dropout,
        torch.dropout,
        torch.alpha_dropout,
        torch.feature_dropout,
        torch.feature_alpha_dropout,
    }
)


class no_dropout(TorchFunctionMode):
    """Dropout is the identity inside: a random mask does not move with permuted samples, so
    the permutation probe of ``choose_sample_axes`` runs without it."""

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: Collection[type],
        args: Sequence[object] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        if func in _DROPOUTS:
            return args[0] if args else kwargs["input"]
        return func(*args, **kwargs)


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b), 1e-12)


def hinted_axes(batch: object, hint: object) -> tuple[list[int] | None, list[str]]:
    """The axes a ``batch_axis`` hint names (an int, or ``(micro-batch axis, row axis)``), or
    None with a note when the hint does not fit the batch."""
    axes = (
        [hint] if isinstance(hint, int) else list(hint) if isinstance(hint, (list, tuple)) else []
    )
    sizes = dict(candidate_axes(batch))
    if not axes or len(axes) > 2 or not all(isinstance(a, int) and a in sizes for a in axes):
        return None, [
            f"batch_axis = {hint!r} does not fit the batch (dims every per-sample tensor "
            f"shares: {sorted(sizes)}): ignored"
        ]
    return axes, [f"samples along dim{'s' * (len(axes) > 1)} {axes}, as batch_axis says"]


def _shared_axis(batch: object, cands: list[tuple[int, int]]) -> int | None:
    """The candidate axis after dim 0 along which every tensor of the batch has the same size,
    when they differ along dim 0 and nowhere else: a seq2seq batch of time-major source and
    target sentences padded to their own lengths, ``src[Ts, B]``, ``tgt[Tt, B]`` (the
    language_translation example's). No probe can tell the axes apart when the step raises
    or its loss is not finite, and these lengths can: time is the axis that differs."""
    leaves = [t for _, t in batch_leaves(batch) if t.dim() >= 2]
    if len(leaves) < 2 or len({t.shape[0] for t in leaves}) < 2:
        return None
    if len({t.shape[1:] for t in leaves}) != 1:
        return None
    return next((d for d, _ in cands[1:]), None)


def choose_sample_axes(
    batch: object, probe: Callable[[object], tuple[float | None, int]], hint: object = None
) -> tuple[list[int], list[str]]:
    """The batch axes that index samples, and notes on how they were found.

    ``hint``: the step function's ``batch_axis`` attribute, if it has one (``train_step.batch_axis
    = 1`` for time-major batches, ``(0, 1)`` for micro-batches): it wins when it fits the batch.

    ``probe(batch)`` replays the step on ``batch`` from the same state, without dropout, and
    returns ``(loss, calls)``: the loss, None when it raised, and how many times the model's
    forward ran. The rule:

    - candidates are ``candidate_axes(batch)``; one candidate is the answer, no probe needed;
    - tensors that differ in length along dim 0 only (time-major source and target sentences,
      ``_shared_axis``): the samples are along the next candidate, no probe needed;
    - the step runs the model once per slice of dim 0 (``calls`` equals its size): dim 0 holds
      micro-batches, and the sample axis is looked for among the other candidates; the answer
      is then ``[0, row axis]``;
    - a candidate is the sample axis when reversing the batch along it leaves the loss the
      same (up to the order of float sums): the loss reduces over samples symmetrically, while
      reversing time in a causal or recurrent model changes it. The first such axis wins; none:
      dim 0, with a note.
    """
    cands = candidate_axes(batch)
    if not cands:
        return [], ["the batch has no tensor with a batch dimension: samples cannot be isolated"]
    hint_notes: list[str] = []
    if hint is not None:
        axes, hint_notes = hinted_axes(batch, hint)
        if axes is not None:
            return axes, hint_notes
    if micro_list(batch):
        return [0, 1], [
            *hint_notes,
            f"the batch is a list of {cands[0][1]} micro-batches: samples are (micro-batch, "
            "row) pairs",
        ]
    if len(cands) == 1:
        return [cands[0][0]], hint_notes
    if (shared := _shared_axis(batch, cands)) is not None:
        return [shared], [
            *hint_notes,
            f"samples are positions along dim {shared}: the batch's tensors have lengths of "
            f"their own along dim 0 and share dim {shared} (time-major sequences)",
        ]
    ref, calls = probe(batch)
    micro = cands[0][1] > 1 and calls == cands[0][1]
    rest = cands[1:] if micro else cands
    notes = hint_notes
    if micro:
        notes.append(
            f"the step runs the model once per slice of dim 0 ({calls} times): "
            "dim 0 holds micro-batches"
        )
    if len(rest) == 1:
        axis = rest[0][0]
    else:
        for d, _ in rest:
            if _same(ref, probe(permute_batch(batch, d))[0]):
                axis = d
                if d != rest[0][0]:
                    notes.append(
                        f"samples are positions along dim {d}: reversing the batch along it "
                        "left the loss the same, along the dims before it not"
                    )
                break
        else:
            axis = rest[0][0]
            why = (
                "the loss is not finite"
                if ref is None or not math.isfinite(ref)
                else "reversing the batch along any of them changed the loss"
            )
            notes.append(
                "the sample axis could not be told apart among dims "
                f"{', '.join(str(d) for d, _ in rest)} ({why}): dim {axis} assumed"
            )
    return ([0, axis] if micro else [axis]), notes


@dataclass(frozen=True)
class Failure:
    """How a replayed step failed: ``kind`` ("exception" or "nonfinite"), the op (the one that
    raised; for NaN/Inf the first op that made a non-finite value out of finite inputs, None
    when none did, e.g. NaN already in the batch) and the exception's type (None for NaN/Inf).
    """

    kind: str
    op: str | None
    exc_type: str | None

    def describe(self) -> str:
        what = self.exc_type or "NaN/Inf"
        return f"{what} at {self.op}" if self.op else what


class FailureProbe(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch: untyped __init_subclass__
    """Watches a replay for how it fails: the op that raised, and (``nonfinite``) the first op
    whose floating output holds NaN/Inf while its floating inputs are finite. After that op is
    found no more outputs are checked: one reduction per op until then.

    NB: not reentrant; enter it around one replayed step.
    """

    def __init__(self, nonfinite: bool) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch stubs
        self.check = nonfinite
        self.raised: str | None = None
        self.producer: str | None = None

    def __torch_dispatch__(
        self,
        func: OpOverload[..., object],
        types: Collection[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except Exception:
            if self.raised is None:
                self.raised = func._schema.name
            raise
        if self.check and self.producer is None:
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if any(floating(t) and not bool(torch.isfinite(t).all()) for t in outs):
                ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
                if all(not floating(t) or bool(torch.isfinite(t).all()) for t in ins):
                    name = func._schema.name
                    if name not in ALLOC_OPS:
                        self.producer = name
                else:
                    self.check = False  # a non-finite input came first: no producer to name
        return out

    def failure(self, exception: dict[str, str] | None, nonfinite: bool) -> Failure | None:
        """The failure seen, given the replay's exception and whether it ended non-finite."""
        if exception is not None:
            return Failure("exception", self.raised, exception.get("type"))
        if nonfinite:
            return Failure("nonfinite", self.producer, None)
        return None


def has_batch_coupling(model: torch.nn.Module) -> bool:
    """True when a layer mixes samples: BatchNorm in training mode (or without running stats)."""
    return any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        and (m.training or not m.track_running_stats)
        for m in model.modules()
    )


def find_culprit_samples(
    fails: Callable[[list[int]], bool], batch_size: int, *, coupled: bool
) -> tuple[list[int], bool]:
    """Smallest set of sample indices (sorted) for which ``fails`` still holds, and whether the
    answer is exact. If the full batch does not fail, returns ``(all indices, False)``."""

    @functools.cache  # (ddmin asks again for subsets it tried)
    def test(ix: tuple[int, ...]) -> bool:
        return bool(fails(list(ix)))

    current = list(range(batch_size))
    if not current or not test(tuple(current)):
        return current, False
    n = 2
    while len(current) >= 2:
        chunk = len(current) / n
        parts = [current[round(i * chunk) : round((i + 1) * chunk)] for i in range(n)]
        parts = [p for p in parts if p]
        for p in parts:  # reduce to a subset
            if test(tuple(p)):
                current, n = p, 2
                break
        else:
            for p in parts:  # reduce to a complement
                rest = [i for i in current if i not in set(p)]
                if n > 2 and rest and test(tuple(rest)):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), 2 * n)
    return sorted(current), not coupled

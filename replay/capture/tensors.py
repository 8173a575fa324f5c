"""Moving trees of tensors between torch and the store's numpy leaves, bit for bit.

``copy_tree`` runs on the training thread: it snapshots a structure (tensors cloned, CUDA tensors
copied to pinned host memory asynchronously) so training can go on mutating the originals.
``to_leaves`` runs on the writer thread and turns the copies into :class:`TensorLeaf`.
``from_leaves`` rebuilds tensors for replay.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..store.tree import SPARSE_LAYOUTS, ObjectRecord, TensorLeaf, as_record, leaves, map_tree
from .pool import HostPool, nbytes, poolable_array

__all__ = [
    "CopyStats",
    "copy_tree",
    "to_leaves",
    "host_leaves",
    "from_leaves",
    "leaf_finite",
]

# dtypes numpy cannot hold natively travel as a same-width integer view.
_VIEW_AS = {torch.bfloat16: torch.int16, torch.complex32: torch.int32}
for _name in (
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
):
    if hasattr(torch, _name):
        _VIEW_AS[getattr(torch, _name)] = torch.uint8


_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


class CopyStats:
    """What ``copy_tree`` saw on the way: whether any tensor was on CUDA (the caller then records
    an event to wait on), how many tensor bytes it copied (the writer's backpressure) and which
    copies came from the pool (given back once written)."""

    __slots__ = ("cuda", "nbytes", "pooled")

    def __init__(self) -> None:
        self.cuda = False
        self.nbytes = 0
        self.pooled: list[Any] = []


def copy_tree(obj: Any, *, stats: CopyStats | None = None, pool: HostPool | None = None) -> Any:
    """A structural copy whose tensors no longer alias the originals.

    CPU tensors are cloned; CUDA tensors are copied into pinned host memory with
    ``non_blocking=True`` (``stats.cuda`` is set so the caller records an event to wait on).
    With a ``pool`` (and ``stats``), plain CPU tensors and arrays are copied into its buffers
    instead, listed in ``stats.pooled`` for the writer to give back.
    """
    return map_tree(lambda x: _copied(x, stats, pool), obj, as_record)


def _copied(obj: Any, stats: CopyStats | None, pool: HostPool | None) -> Any:
    """One leaf of ``copy_tree``."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach() if obj.requires_grad else obj  # each op costs ~15 us in a training loop
        if stats is not None:
            stats.nbytes += t.numel() * t.element_size()
            if pool is not None and pool.takes(obj):
                out = pool.copy(t)
                stats.pooled.append(out)
                if pool.state:  # (a reused buffer: what it holds is said every time)
                    out._replay_grad = obj.requires_grad  # type: ignore[attr-defined]
                    if t.is_cuda:
                        stats.cuda = True
                        out._replay_device = str(t.device)  # type: ignore[attr-defined]
                return out
        if t.is_cuda:
            if t.layout != torch.strided:
                # A sparse graph: a dense buffer cannot take it (copy_ raised, and the step went
                # unrecorded), so it is copied as it is, and waited for.
                host = t.to("cpu")
            else:
                if stats is not None:
                    stats.cuda = True
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                _keep_strides(t, host)
            host._replay_device = str(t.device)  # type: ignore[attr-defined]
            host._replay_grad = obj.requires_grad  # type: ignore[attr-defined]
            return host
        out = t.clone() if t.device.type == "cpu" else t.to("cpu")
        if obj.requires_grad:
            out._replay_grad = True  # type: ignore[attr-defined]
        _keep_strides(t, out)
        return out
    if isinstance(obj, np.ndarray):
        if stats is not None:
            stats.nbytes += int(obj.nbytes)
            if pool is not None and poolable_array(obj):
                arr = pool.copy_array(obj)
                stats.pooled.append(arr)
                return arr
        return obj.copy()
    return obj


def _keep_strides(t: torch.Tensor, copy: torch.Tensor) -> None:
    """The copy of a tensor that is not contiguous (a channels_last or transposed batch) says
    how the original was laid out: a clone of a slice is contiguous, and ops can give other
    bits on another layout (a BatchNorm over a channels_last batch)."""
    try:
        contiguous = t.is_contiguous()
    except RuntimeError:  # (a sparse CSR/CSC batch has no strides: its leaf keeps its layout)
        return
    if not contiguous:
        copy._replay_strides = tuple(t.stride())  # type: ignore[attr-defined]


def _tensor_leaf(t: torch.Tensor) -> TensorLeaf:
    on_cpu = t.is_cpu  # (a bool: ``t.device`` makes a device object each time)
    device = getattr(t, "_replay_device", None) or ("cpu" if on_cpu else str(t.device))
    grad = bool(getattr(t, "_replay_grad", False))
    strides = getattr(t, "_replay_strides", None)
    if strides is None and not t.is_contiguous():
        strides = tuple(t.stride())
    # The copies copy_tree made are plain CPU tensors: no detach/cpu calls for them (each
    # torch call on the writer thread competes with training for the GIL).
    if t.requires_grad:
        t = t.detach()
    if not on_cpu:
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    view = _VIEW_AS.get(t.dtype)
    data = (t.contiguous().view(view) if view is not None else t).numpy()
    return TensorLeaf(_dtype_name(t.dtype), data, device, grad, strides)


def tree_nbytes(obj: Any) -> int:
    """Bytes of the tensors and arrays in a nested structure (a size hint; nothing is copied)."""
    return sum(nbytes(x) for _, x in leaves(obj) if isinstance(x, (torch.Tensor, np.ndarray)))


def to_leaves(obj: Any) -> Any:
    """Replace tensors by :class:`TensorLeaf` (writer thread; no copy for CPU clones)."""
    return map_tree(_leaf_of, obj, as_record)


class _OffHost(Exception):
    """A tensor of the tree is not in host memory (``host_leaves``)."""


def host_leaves(obj: Any) -> Any:
    """``to_leaves`` of a tree whose tensors are all in host memory (and strided), else
    ``None``: no copy at all (the step log's record copies the leaves' bytes once), and one
    walk of the batch where a check of where it lives and its leaves took three."""
    try:
        return map_tree(_host_leaf, obj, as_record)
    except _OffHost:
        return None


def _host_leaf(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        if not obj.is_cpu or obj.layout != torch.strided:
            raise _OffHost
        return _tensor_leaf(obj)
    return _leaf_of(obj)


def _leaf_of(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:  # (a sparse graph: gcn's adjacency) its values, dense
            dense = obj.to_dense()
            for name in ("_replay_device", "_replay_grad"):  # (a GPU's copied to the host)
                setattr(dense, name, getattr(obj, name, None))
            leaf = _tensor_leaf(dense)
            layout = str(obj.layout).removeprefix("torch.")
            leaf.layout = layout if layout in SPARSE_LAYOUTS else None
            return leaf
        return _tensor_leaf(obj)
    if isinstance(obj, (torch.dtype, torch.device)):
        return str(obj)
    return obj


def leaf_to_tensor(leaf: TensorLeaf, device: str | torch.device | None = None) -> torch.Tensor:
    data = leaf.data if leaf.data.flags.c_contiguous else np.ascontiguousarray(leaf.data)
    t = torch.from_numpy(data.reshape(leaf.data.shape))
    dtype = getattr(torch, leaf.dtype)
    if t.dtype != dtype:
        t = t.view(dtype)
    target = leaf.device if device is None else device
    if leaf.strides is not None:
        t = _laid_out(t, leaf.strides, target)
    elif str(target) != "cpu":
        t = t.to(target)
    if leaf.layout in SPARSE_LAYOUTS:  # sparse again: a dense one gives other bits in spmm
        t = t.to_sparse(layout=getattr(torch, leaf.layout))
    if leaf.requires_grad and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def _laid_out(
    t: torch.Tensor, strides: tuple[int, ...], device: str | torch.device
) -> torch.Tensor:
    """``t``'s values on ``device`` with the recorded ``strides``. A dimension of stride 0 (an
    expanded tensor) is made once and expanded; a layout whose elements overlap otherwise
    cannot be written element by element, and comes back contiguous."""
    broadcast = [d for d, (n, x) in enumerate(zip(t.shape, strides)) if x == 0 and n > 1]
    base = t
    for d in broadcast:
        base = base.narrow(d, 0, 1)
    out = torch.empty_strided(base.shape, strides, dtype=t.dtype, device=device)
    try:
        out.copy_(base)
    except RuntimeError:  # elements that overlap (an as_strided view): no layout to copy into
        return t.to(device)
    return out.expand(t.shape) if broadcast else out


def leaf_finite(leaf: TensorLeaf) -> bool:
    """Whether every element of a floating-point leaf is finite, checked without a copy."""
    data = leaf.data
    if data.dtype.kind in "fc":  # float16/32/64 and complex: numpy holds them natively
        return bool(np.isfinite(data).all())
    return bool(torch.isfinite(leaf_to_tensor(leaf, "cpu")).all())


def from_leaves(
    obj: Any,
    device: str | torch.device | None = None,
    classes: Callable[[str, str], type | None] | None = None,
) -> Any:
    """Rebuild tensors from :class:`TensorLeaf` leaves (on ``device``, else where recorded).

    An object record becomes an instance of the class ``classes(module, qualname)`` returns
    (``engine.classes.OwnClasses``: the program's own, plain to make), else a stand-in."""
    return map_tree(
        lambda x: leaf_to_tensor(x, device) if isinstance(x, TensorLeaf) else x,
        obj,
        lambda _, rec: live_object(rec, classes),
    )


def live_object(rec: ObjectRecord, classes: Callable[[str, str], type | None] | None) -> Any:
    """The object ``rec`` describes, with its attributes: of its own class where ``classes``
    gives one, made without calling its ``__init__``; else a stand-in with the same ones."""
    cls: Any = classes(rec.module, rec.qualname) if classes is not None else None
    if cls is not None:
        try:
            obj = cls.__new__(cls)
            for k, v in rec.attrs.items():
                object.__setattr__(obj, k, v)
            return obj
        except Exception:  # noqa: BLE001 - a class that cannot be made so: the stand-in
            pass
    stand_in = type(rec.qualname.rsplit(".", 1)[-1], (types.SimpleNamespace,), {})
    return stand_in(**rec.attrs)

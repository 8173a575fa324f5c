"""Per-tensor summary statistics, computed with fused reductions and returned as Python numbers.

Small CPU tensors (at most ``NUMPY_MAX`` values, the many small ops of an RNN or an optimizer's
per-parameter update) are measured in numpy on the tensor's own memory, with torch's Python
dispatch switched off while it is read: a torch reduction called from Python inside the tracing
modes costs tens of microseconds, a numpy one about one.

Any other tensor (large, not float32/float64, or on a GPU) is reduced on its own device into one
small float64 tensor that is read to the host once: the statistics and an evenly strided sample
of at most about ``2 * HIST_SAMPLE`` values, packed together. The fast path (every value finite,
which ``aminmax`` decides) costs four reductions: ``aminmax``, ``sum``, ``dot`` (sum of squares)
and ``count_nonzero``. Only a tensor holding NaN or Inf pays for masks, and a second read. The
histogram is drawn in numpy from the host copy of the sample (``torch.histc`` has no
deterministic CUDA kernel; nothing here is an op ``torch.use_deterministic_algorithms`` forbids):
it is a picture, not an exact count, scaled to the tensor's size.

NB: call these with the tracing modes switched off; they never keep a reference to the tensor.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ..capture.sharded import local

__all__ = [
    "copy_small",
    "quiet_numpy",
    "Stats",
    "N_BINS",
    "NO_STATS",
    "tensor_stats",
    "np_stats",
    "stats_dict",
    "finite_kind",
    "floating",
    "real_parts",
    "kind_of_row",
]

N_BINS = 16
HIST_SAMPLE = 256  # 16 bins: a picture of the values, drawn from a few hundred of them
NUMPY_MAX = 1 << 16  # values: below this a CPU tensor is measured in numpy
_NP_FLOATS = (torch.float32, torch.float64)
NAN = float("nan")


class Stats(NamedTuple):
    """One tensor's statistics: one row of ``/ops/stats``, in the file's column order.

    min/max/mean/std/absmax are over the finite values; the counts are over all values, as
    floats (the column is float64). A tuple, so that a list of them is the column as it is.
    """

    min: float
    max: float
    mean: float
    std: float
    absmax: float
    nan: float
    posinf: float
    neginf: float
    zeros: float
    numel: float


#: The row of an op without a tensor output (or one that raised): nothing measured.
NO_STATS = Stats(NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 0.0)
NO_HIST = np.zeros(N_BINS, dtype=np.float32)


def _flat(t: torch.Tensor) -> torch.Tensor:
    f = t.detach().reshape(-1)
    if f.dtype not in (torch.float32, torch.float64):
        f = f.to(torch.float32)
    return f


def _sample_step(n: int) -> int:
    return max(1, n // HIST_SAMPLE)


def _read(
    parts: list[torch.Tensor], f: torch.Tensor, hist: bool
) -> tuple[list[float], list[float]]:
    """``parts`` (0-d reductions on ``f``'s device) and, with ``hist``, an evenly strided
    sample of ``f``, packed into one float64 tensor and read to the host in ONE read: the
    statistics of an op on a GPU cost one device-to-host copy, not one per number. Returns
    (the parts' values, the sample's values)."""
    packed = torch.stack([p.to(torch.float64) for p in parts])
    if hist:
        step = _sample_step(f.numel())
        packed = torch.cat([packed, (f[::step] if step > 1 else f).to(torch.float64)])
    values: list[float] = packed.tolist()
    return values[: len(parts)], values[len(parts) :]


def _sample_hist(sample: np.ndarray, n: int, lo: float, hi: float) -> np.ndarray:
    """The histogram of ``n`` finite values in [lo, hi] from a host copy of a strided sample of
    them (``sample``, every value finite: numpy on the host, as ``torch.histc`` has no
    deterministic CUDA kernel), scaled to ``n``."""
    h = np.zeros(N_BINS, dtype=np.float32)
    if n < 2 or hi <= lo:
        h[0] = n
        return h
    if sample.size == 0:
        return h
    idx = ((sample.astype(np.float64) - lo) * (N_BINS / (hi - lo))).astype(np.intp)
    # every value is in [lo, hi]: only the top needs clipping (hi itself lands in the last bin)
    np.minimum(idx, N_BINS - 1, out=idx)
    h[:] = np.bincount(idx, minlength=N_BINS)
    if sample.size != n:
        h *= n / sample.size
    return h


def _sumsq(f: torch.Tensor) -> torch.Tensor:
    return torch.dot(f, f) if f.dtype == torch.float32 else (f * f).sum()


def _sumsq_past(f: torch.Tensor, sq: float, absmax: float) -> float:
    """``sq`` (``f``'s sum of squares), or where float32's overflowed (values past 1.8e19: an
    exploding activation, the std read as inf) that of ``f / absmax`` times ``absmax**2`` on
    the host (one more read, only then)."""
    if math.isfinite(sq) or not 0 < absmax < math.inf:
        return sq
    return float(_sumsq(f / absmax)) * absmax * absmax


def _moments(n: int, s: float, sq: float) -> tuple[float, float]:
    mean = s / n
    var = max(0.0, sq / n - mean * mean)
    return mean, math.sqrt(var)


def _device_stats(f: torch.Tensor, n: int, hist: bool) -> tuple[Stats, np.ndarray]:
    """The statistics of ``f`` (flat float32/float64, ``n > 0`` values), reduced on its own
    device, whatever that is (no branch on the device type: a CPU tensor that reaches here
    takes the path a CUDA one takes, so the tests on the CPU run it).

    Every op is one ``use_deterministic_algorithms`` allows on CUDA (no ``histc``, no
    indexing by a mask, which would also synchronise to size its result). A tensor whose
    values are all finite costs one read to the host (statistics and sample together); one
    holding NaN or Inf pays a second, masked reduction and its read.
    """
    lo_t, hi_t = torch.aminmax(f)
    (lo, hi, s, sq, nz), sample = _read(
        [lo_t, hi_t, f.sum(dtype=torch.float64), _sumsq(f), torch.count_nonzero(f)], f, hist
    )
    zeros = float(n - nz)
    if math.isfinite(lo) and math.isfinite(hi):
        mean, std = _moments(n, s, _sumsq_past(f, sq, max(-lo, hi)))
        row = Stats(lo, hi, mean, std, max(abs(lo), abs(hi)), 0.0, 0.0, 0.0, zeros, float(n))
        return row, (_sample_hist(np.asarray(sample), n, lo, hi) if hist else NO_HIST)
    finite = torch.isfinite(f)
    good = torch.where(finite, f, 0.0)  # a mask-sized copy, not a compaction: no sync
    parts = [
        finite.sum(),
        torch.isnan(f).sum(),
        (f == math.inf).sum(),
        (f == -math.inf).sum(),
        torch.where(finite, f, math.inf).amin(),
        torch.where(finite, f, -math.inf).amax(),
        good.sum(dtype=torch.float64),
        _sumsq(good),
    ]
    (m, n_nan, n_pos, n_neg, lo, hi, s, sq), sample = _read(parts, f, hist)
    if m == 0:
        return Stats(NAN, NAN, NAN, NAN, NAN, n_nan, n_pos, n_neg, zeros, float(n)), NO_HIST
    mean, std = _moments(int(m), s, _sumsq_past(good, sq, max(-lo, hi)))
    row = Stats(lo, hi, mean, std, max(abs(lo), abs(hi)), n_nan, n_pos, n_neg, zeros, float(n))
    if not hist:
        return row, NO_HIST
    a = np.asarray(sample)  # the sample's finite values (the scale counts only those)
    return row, _sample_hist(a[np.isfinite(a)], int(m), lo, hi)


_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def floating(t: torch.Tensor) -> bool:
    """Whether ``t`` holds values that can be NaN/Inf: a floating or a complex tensor (a
    spectral layer's ``rfft``, an STFT loss; a complex value is non-finite when a part is)."""
    return t.is_floating_point() or t.is_complex()


def real_parts(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor's real and imaginary parts as a real tensor (a view, a copy where the
    conjugate bit is set): its statistics are theirs. Any other tensor as it is."""
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def physical(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s values: ``t`` itself, or under a torch.func transform
    (``vmap``, ``grad``: per-sample gradients, DP-SGD) the tensor inside its wrappers, which
    have no storage of their own (a vmapped tensor's holds every sample's values). Read it
    with the transforms off (``torch._C._DisableFuncTorch``): inside one, an op's result is
    wrapped again."""
    while _wrapped(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def stored_values(t: torch.Tensor) -> torch.Tensor:
    """The values a sparse tensor stores (``nn.Embedding(sparse=True)``'s gradients,
    ``SparseAdam``'s updates): statistics of a sparse tensor are those of its stored values;
    a dense tensor as it is."""
    if t.layout is torch.strided:
        return t
    if t.layout is torch.sparse_coo:
        return t.coalesce()._values()  # (an index stored twice holds the sum of both)
    return t.values()  # CSR, CSC, BSR, BSC


def copy_small(t: torch.Tensor) -> np.ndarray | None:
    """A flat numpy copy of a small (``NUMPY_MAX`` values at most), plain, CPU float32/float64
    tensor's values, else None.

    Call with torch functions disabled (``on_op`` does; ``_small_array`` disables them):
    ``detach``/``clone`` run with Python dispatch off, unseen by the tracer. A copy, never a
    view of the tensor's memory: numpy's view makes a storage unresizable, and FSDP2 frees its
    unsharded parameters by resizing their storage to zero after the forward ("Trying to
    resize storage that is not resizable").
    """
    if (
        type(t) is not torch.Tensor
        or t.dtype not in _NP_FLOATS
        or not t.is_cpu
        or t.layout is not torch.strided  # (a sparse gradient: measured by its stored values)
    ):
        return None
    n = t.numel()
    if n == 0 or n > NUMPY_MAX:
        return None
    with torch._C._DisableTorchDispatch():
        # an op's output seen by the dispatch mode does not require grad yet: no detach (one
        # dispatcher call less, as much as a small op costs)
        c = t.detach().clone() if t.requires_grad else t.clone()
    a: np.ndarray = c.numpy()
    return a.reshape(-1)


def _small_array(t: torch.Tensor) -> np.ndarray | None:
    """``copy_small`` of any tensor (None under a torch.func transform: no mode sees it)."""
    if _wrapped(t):
        return None
    with torch._C.DisableTorchFunction():  # Tensor methods would go through the modes
        return copy_small(t)


class quiet_numpy:
    """numpy's floating-point warnings off while a step is traced (a float32 sum of squares may
    overflow: that is a statistic, not an error); the settings are restored on exit."""

    def __enter__(self) -> None:
        self._old = np.seterr(all="ignore")

    def __exit__(self, *exc: object) -> None:
        np.seterr(**self._old)


def np_stats(a: np.ndarray, hist: bool) -> tuple[Stats, np.ndarray]:
    """``tensor_stats`` of a flat numpy copy of a tensor's values (numpy warnings off)."""
    n = a.size
    zeros = float(n - np.count_nonzero(a))
    lo, hi = float(a.min()), float(a.max())
    n_nan = n_pos = n_neg = 0.0
    good = a
    if not (math.isfinite(lo) and math.isfinite(hi)):
        n_nan = float(np.count_nonzero(np.isnan(a)))
        n_pos = float(np.count_nonzero(a == math.inf))
        n_neg = float(np.count_nonzero(a == -math.inf))
        good = a[np.isfinite(a)]
        if good.size == 0:
            return Stats(NAN, NAN, NAN, NAN, NAN, n_nan, n_pos, n_neg, zeros, float(n)), NO_HIST
        lo, hi = float(good.min()), float(good.max())
    m = good.size
    # no np.errstate here (it costs more than these reductions): the tracer runs with numpy's
    # floating-point warnings off (quiet_numpy)
    mean = float(good.sum(dtype=np.float64)) / m
    sq = float(np.dot(good, good)) / m
    if not math.isfinite(sq) and (big := max(-lo, hi)) > 0:  # float32's overflowed: rescaled
        sq = float(np.dot(good / big, good / big)) / m * big * big
    std = math.sqrt(max(0.0, sq - mean * mean))
    row = Stats(lo, hi, mean, std, max(abs(lo), abs(hi)), n_nan, n_pos, n_neg, zeros, float(n))
    return row, (_sample_hist(good[:: _sample_step(m)], m, lo, hi) if hist else NO_HIST)


def tensor_stats(t: torch.Tensor, *, hist: bool = True) -> tuple[Stats, np.ndarray]:
    """``(row, hist)``: the tensor's :class:`Stats` and histogram; non-floating tensors get
    min/max/mean over their values and zero NaN counts; a complex tensor's are over its real
    and imaginary parts (twice its numel values; it was all NaN, and its NaN went unseen).
    """
    if _wrapped(t):  # inside a torch.func transform: the values of every sample
        with torch._C._DisableFuncTorch():
            return tensor_stats(physical(t), hist=hist)
    if t.layout is not torch.strided:
        return tensor_stats(stored_values(t), hist=hist)
    if t.is_complex():
        return tensor_stats(real_parts(t), hist=hist)
    a = _small_array(t)
    if a is not None:
        if np.geterr()["over"] != "ignore":  # called outside a traced step
            with quiet_numpy():
                return np_stats(a, hist)
        return np_stats(a, hist)
    # An FSDP2 DTensor: this rank's shard (reading a DTensor's statistics would be a
    # collective that only this rank makes; each rank traces its own step).
    t = local(t)
    n = t.numel()
    if n == 0:
        return Stats(NAN, NAN, NAN, NAN, NAN, 0.0, 0.0, 0.0, 0.0, 0.0), NO_HIST
    if t.dtype == torch.bool:
        z = float(n - _read([torch.count_nonzero(t)], t, False)[0][0])
        return Stats(0.0, 1.0, 1.0 - z / n, NAN, 1.0, 0.0, 0.0, 0.0, z, float(n)), NO_HIST
    return _device_stats(_flat(t), n, hist)


def finite_kind(t: torch.Tensor) -> str:
    """ "finite", "neginf" (the non-finite values are all -inf), "inf" (+inf, no NaN) or "nan".

    One ``aminmax`` (NaN propagates through it); non-floating tensors are "finite", complex
    ones are classified by their real and imaginary parts.
    """
    if _wrapped(t):
        with torch._C._DisableFuncTorch():
            return finite_kind(physical(t))
    if t.layout is not torch.strided:
        return finite_kind(stored_values(t))
    if t.is_complex():
        return finite_kind(real_parts(t))
    a = _small_array(t)
    if a is not None:
        lo, hi = float(a.min()), float(a.max())
    else:
        t = local(t)  # an FSDP2 DTensor: this rank's shard, as in tensor_stats
        if not t.is_floating_point() or t.numel() == 0:
            return "finite"
        (lo, hi), _ = _read(list(torch.aminmax(_flat(t))), t, False)  # one read
    if math.isfinite(lo) and math.isfinite(hi):
        return "finite"
    if math.isnan(lo) or math.isnan(hi):
        return "nan"
    return "inf" if hi == math.inf else "neginf"


def kind_of_row(row: Stats) -> str:
    """The same classification as ``finite_kind``, from a statistics row."""
    if row.nan > 0:
        return "nan"
    if row.posinf > 0:
        return "inf"
    return "neginf" if row.neginf > 0 else "finite"


def stats_dict(row: Stats) -> dict[str, float]:
    """``{column: value}`` (the JSON form of a row, ``ForensicsReader.op_row``'s ``stats``)."""
    return dict(zip(Stats._fields, (float(v) for v in row)))

"""The trace's statistics path for tensors numpy does not measure (on a GPU, large, not float32):
reduced on the tensor's device, read to the host once, nothing deterministic mode forbids.

No GPU here: the path has no branch on the device type, so a CPU tensor that reaches it (a
subclass, a large one, a bf16 one) runs the code a CUDA tensor runs. Issue 43, item 1: the
histogram was ``torch.histc(...).numpy()`` on the device tensor, a TypeError at the first CUDA
op with two distinct values and an error under ``use_deterministic_algorithms(True)``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from replay.trace.stats import NUMPY_MAX, finite_kind, np_stats, tensor_stats

#: aten ops with no deterministic CUDA kernel (torch raises under deterministic mode), or that
#: size their result from the values (a device-to-host sync): none may measure an op.
FORBIDDEN = {
    "histc",
    "bincount",
    "scatter_add",
    "scatter_add_",
    "index_add",
    "index_add_",
    "index_put_",
    "put_",
    "kthvalue",
    "median",
    "nanmedian",
    "nonzero",
    "masked_select",
    "unique",
    "_unique2",
}
READS = ("item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__")


class OnDevice(torch.Tensor):
    """A CPU tensor standing in for a CUDA one: not a plain ``torch.Tensor``, so numpy's fast
    path declines it, as it declines a CUDA tensor."""


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@contextmanager
def host_reads() -> Iterator[Counter[str]]:
    """Counts every way a tensor's values reach Python while the block runs."""
    counts: Counter[str] = Counter()
    saved = {name: getattr(torch.Tensor, name) for name in READS}
    depth = [0]  # a subclass's __torch_function__ calls the method again: one read

    def counting(name: str) -> Any:
        def read(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            counts[name] += depth[0] == 0
            depth[0] += 1
            try:
                return saved[name](self, *a, **k)
            finally:
                depth[0] -= 1

        return read

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


@contextmanager
def deterministic() -> Iterator[None]:
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


def _values(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3 + 1


def _cases() -> dict[str, torch.Tensor]:
    big = _values(NUMPY_MAX + 1000)
    bad = big.clone()
    bad[::997] = math.nan
    bad[5] = math.inf
    bad[9] = -math.inf
    return {
        "large float32": big,
        "subclass float32": _values(3000).as_subclass(OnDevice),
        "bf16": _values(5000).to(torch.bfloat16),
        "fp16": _values(5000).to(torch.float16),
        "int64": torch.arange(-50, 4000),
        "bool": torch.arange(300) % 3 == 0,
        "empty": torch.empty(0, 4).as_subclass(OnDevice),
        "nonfinite float32": bad,
        "nonfinite fp16": bad[:9000].to(torch.float16),
        "all nan": torch.full((NUMPY_MAX + 1,), math.nan),
        "sparse": torch.sparse_coo_tensor(
            [[0, 7, 9]], [1.5, -2.0, math.nan], (20,), check_invariants=True
        ),
    }


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_device_statistics_run_under_deterministic_mode_with_one_host_read(name: str) -> None:
    """(a) deterministic mode on, warn_only off: no op raises, none is one that has no
    deterministic CUDA kernel; (b) an op's statistics and sample reach the host in one read
    when its values are finite, two when they hold NaN or Inf."""
    t = CASES[name]
    ops = _Ops()
    with deterministic(), host_reads() as counts, ops:
        row, hist = tensor_stats(t)
        kind = finite_kind(t)
    assert not ops.names & FORBIDDEN, ops.names & FORBIDDEN
    assert "histc" not in ops.names
    reads = sum(counts.values())
    if t.numel() == 0 or t.is_sparse:
        assert reads <= 3  # sparse: coalesce + the values' statistics; empty: none
    elif row.nan or row.posinf or row.neginf:
        assert reads <= 3, counts  # two for the statistics, one for finite_kind
    else:
        assert reads <= 2, counts  # one for the statistics, one for finite_kind
    assert kind in ("finite", "nan", "inf", "neginf")
    assert hist.shape == (16,)


def test_a_finite_op_costs_exactly_one_read_whatever_its_dtype() -> None:
    """The six ``.item()``s of the old path (min, max, zeros, sum, sum of squares, the
    histogram's ``.numpy()``) are one read."""
    for t in (CASES["large float32"], CASES["bf16"], CASES["subclass float32"], CASES["int64"]):
        with host_reads() as counts:
            tensor_stats(t)
        assert sum(counts.values()) == 1, (t.dtype, counts)
        with host_reads() as counts:
            finite_kind(t)
        assert sum(counts.values()) <= 1, (t.dtype, counts)


def _reference(t: torch.Tensor) -> tuple[Any, np.ndarray]:
    return np_stats(t.detach().to(torch.float64).reshape(-1).numpy().copy(), True)


@pytest.mark.parametrize("name", ["large float32", "subclass float32", "bf16", "int64"])
def test_device_statistics_match_numpys_rows(name: str) -> None:
    """The same rows as the numpy path that measures small CPU tensors: the counts and the
    extremes exactly, the moments to rounding, the histogram bin for bin (same sample, same
    binning)."""
    t = CASES[name]
    row, hist = tensor_stats(t)
    ref, ref_hist = _reference(t)
    for col in ("min", "max", "absmax", "nan", "posinf", "neginf", "zeros", "numel"):
        assert getattr(row, col) == getattr(ref, col), col
    assert row.mean == pytest.approx(ref.mean, rel=1e-6, abs=1e-9)
    assert row.std == pytest.approx(ref.std, rel=1e-5)
    np.testing.assert_allclose(hist, ref_hist, rtol=1e-6)
    assert hist.sum() == pytest.approx(t.numel(), rel=1e-6)


def test_nonfinite_values_are_counted_and_left_out_of_the_moments_on_the_device() -> None:
    t = CASES["nonfinite float32"]
    row, hist = tensor_stats(t)
    a = t.numpy()
    good = a[np.isfinite(a)].astype(np.float64)
    assert row.nan == float(np.isnan(a).sum()) and row.posinf == 1.0 and row.neginf == 1.0
    assert (row.min, row.max) == (good.min(), good.max())
    assert row.mean == pytest.approx(good.mean(), rel=1e-6)
    assert row.std == pytest.approx(good.std(), rel=1e-5)
    assert hist.sum() == pytest.approx(good.size, rel=1e-6)
    assert finite_kind(t) == "nan"
    all_nan, _ = tensor_stats(CASES["all nan"])
    assert math.isnan(all_nan.mean) and all_nan.nan == all_nan.numel
    empty, _ = tensor_stats(CASES["empty"])
    assert empty.numel == 0.0
    b, _ = tensor_stats(CASES["bool"])
    assert b.zeros == 200.0 and b.mean == pytest.approx(1 / 3)


@pytest.mark.parametrize("n", [64, NUMPY_MAX * 4], ids=["numpy", "device"])
@pytest.mark.parametrize("with_nan", [False, True], ids=["finite", "some_nan"])
def test_the_std_of_values_past_float32s_square_root_is_finite(n: int, with_nan: bool) -> None:
    """An exploding activation (values ~1e25, every one finite) showed std inf: the float32
    sum of squares overflowed. It is rescaled by the largest |value| where it overflows."""
    t = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 1e25
    if with_nan:
        t[3] = math.nan
    want = float(t[~t.isnan()].double().std(unbiased=False))
    row, _ = tensor_stats(t)
    assert math.isclose(row.std, want, rel_tol=1e-5), (row.std, want)

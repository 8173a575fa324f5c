"""Batches and state go through the store and come back bit for bit, dtype, shape and structure."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch

from replay.capture.tensors import copy_tree, from_leaves, to_leaves
from replay.errors import RecordingError
from replay.store.tree import Opaque, TensorLeaf, decode
from replay.store.validate import check_tree
from replay.store.writer import pack_parts

Pair = collections.namedtuple("Pair", ["x", "y"])

SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, 3.4e38, -1.5]


def roundtrip(tree):
    parts, mlen = pack_parts(to_leaves(copy_tree(tree)))
    payload = np.concatenate(parts)
    import json

    manifest = json.loads(payload[:mlen].tobytes())
    arena = payload[mlen:].tobytes()
    # What the writer writes, the reader's checks (untrusted input, issue 23) must accept.
    check_tree(manifest, len(arena), "roundtrip")
    return from_leaves(decode(manifest, arena))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width))


FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_float_dtypes_keep_every_bit_including_nan_inf_and_signed_zero(dtype):
    t = torch.tensor(SPECIAL, dtype=torch.float64).to(dtype).reshape(2, 4)
    back = roundtrip(t)
    assert same_bits(t, back)


@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool], ids=str)
def test_integer_and_bool_dtypes(dtype):
    t = torch.arange(-6, 6).reshape(3, 4)
    t = (t > 0) if dtype == torch.bool else t.to(dtype)
    assert same_bits(t, roundtrip(t))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "complex64", "complex128"])
def test_exotic_dtypes(name):
    dtype = getattr(torch, name)
    src = torch.linspace(-2, 2, 12)
    t = torch.complex(src, -src).to(dtype) if dtype.is_complex else src.to(dtype)
    assert same_bits(t, roundtrip(t))


def test_zero_dim_tensor_keeps_its_shape():
    """np.ascontiguousarray turns a 0-d array into 1-d; a scalar tensor must stay 0-d."""
    back = roundtrip(torch.tensor(7))
    assert back.shape == () and back.item() == 7


def test_nested_structures_with_every_leaf_kind():
    tree = {
        "img": torch.randn(2, 3, 4, 4),
        "meta": Pair(x=[1, 2.5, None, True], y=("a", b"\x00\xff")),
        "np": np.arange(6, dtype=np.float16).reshape(2, 3),
        "npscalar": np.float32(1.5),
        5: {"deep": [torch.tensor(7), torch.zeros(0, 3)]},
        "big": 2**70,
        "c": complex(1, -2),
        "nan": math.nan,
    }
    back = roundtrip(tree)
    assert set(back) == set(tree)
    assert same_bits(back["img"], tree["img"])
    assert back["meta"].x == [1, 2.5, None, True]
    assert back["meta"].y == ("a", b"\x00\xff")
    assert type(back["meta"]).__name__ == "Pair" and back["meta"]._fields == ("x", "y")
    assert back["np"].dtype == np.float16 and np.array_equal(back["np"], tree["np"])
    assert back["npscalar"] == np.float32(1.5) and back["npscalar"].dtype == np.float32
    assert same_bits(back[5]["deep"][0], torch.tensor(7))
    assert back[5]["deep"][1].shape == (0, 3)
    assert back["big"] == 2**70 and back["c"] == complex(1, -2) and math.isnan(back["nan"])


def test_non_contiguous_and_requires_grad_tensors():
    base = torch.randn(4, 6, requires_grad=True)
    view = base.detach().t()[1:, ::2]
    back = roundtrip({"v": view, "p": base})
    assert torch.equal(back["v"], view)
    assert back["p"].requires_grad and torch.equal(back["p"].detach(), base.detach())


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
        lambda: torch.randn(6, 4).t(),
        lambda: torch.randn(4, 16)[:, ::2],
        lambda: torch.randn(4, 1).expand(4, 5),
        lambda: torch.randn(2, 3, 4, 5, dtype=torch.bfloat16).permute(0, 2, 3, 1),
    ],
    ids=["channels_last", "transposed", "sliced", "expanded", "bf16_permuted"],
)
def test_a_non_contiguous_tensor_comes_back_with_its_strides(make):
    """Ops can give other bits on another memory layout (a BatchNorm over a channels_last
    batch): a tensor comes back laid out as recorded, whether copied first or not."""
    x = make()
    back = roundtrip(x)
    assert same_bits(back, x) and back.stride() == x.stride()
    assert to_leaves(x).strides == x.stride() and to_leaves(copy_tree(x)).strides == x.stride()


def test_a_tensor_leaf_without_strides_is_contiguous_as_files_before_v4_hold_it():
    manifest = {"t": "tensor", "dtype": "<f4", "shape": [2, 3], "off": 0, "n": 24}
    manifest.update(tdtype="float32", device="cpu", grad=False)
    arena = np.arange(6, dtype=np.float32).tobytes()
    check_tree(manifest, len(arena), "v3")
    back = from_leaves(decode(manifest, arena))
    assert back.is_contiguous() and back.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    "strides", [[1], [3, "1"], [3, -1], [2**40, 1]], ids=["rank", "type", "negative", "span"]
)
def test_a_tensor_leafs_strides_are_checked_before_any_memory_is_laid_out(strides):
    """A file's strides could ask for any amount of memory: at most 64 times the elements."""
    manifest = {"t": "tensor", "dtype": "<f4", "shape": [2, 3], "off": 0, "n": 24}
    manifest.update(tdtype="float32", device="cpu", grad=False, strides=strides)
    with pytest.raises(RecordingError, match="unusable strides"):
        check_tree(manifest, 24, "hostile")


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")  # (torch's own)
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc])
def test_a_sparse_batch_comes_back_sparse_and_gives_the_recorded_bits_in_spmm(layout):
    """Regression: pytorch/examples' gcn hands its sparse adjacency and features to the step;
    the recorder kept them dense and a replay ran ``torch.spmm`` on dense tensors, whose sums
    differ in the last bits (1 ulp at step 12 of a 400-node graph), and verify blamed state
    changed outside the step. The values are kept dense as before, with the layout beside."""
    g = torch.Generator().manual_seed(0)
    adj = (torch.rand(400, 400, generator=g) < 0.01).float() * torch.rand(400, 400, generator=g)
    support = torch.randn(400, 16, generator=g)
    sparse = adj.to_sparse(layout=layout)
    back = roundtrip({"adj": sparse})["adj"]
    assert back.layout == layout and same_bits(back.to_dense(), adj)
    assert same_bits(torch.sparse.mm(back, support), torch.sparse.mm(sparse, support))
    assert not same_bits(torch.mm(adj, support), torch.sparse.mm(sparse, support))  # dense: not
    assert to_leaves(copy_tree(sparse)).layout == str(layout).removeprefix("torch.")


@pytest.mark.parametrize("layout", ["sparse_bsr", "strided", ["sparse_coo"], 7])
def test_a_tensor_leaf_naming_another_layout_comes_back_dense(layout):
    """The file is untrusted: a layout this reader does not make again is no layout."""
    manifest = {"t": "tensor", "dtype": "<f4", "shape": [2, 3], "off": 0, "n": 24}
    manifest.update(tdtype="float32", device="cpu", grad=False, layout=layout)
    arena = np.arange(6, dtype=np.float32).tobytes()
    check_tree(manifest, len(arena), "hostile")
    back = from_leaves(decode(manifest, arena))
    assert back.layout == torch.strided and back.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_copy_tree_is_not_aliased_by_later_in_place_edits():
    x = torch.ones(3)
    copied = copy_tree({"x": x})
    x.add_(5)
    assert torch.equal(roundtrip(copied)["x"], torch.ones(3))


def test_unsupported_objects_become_opaque_never_pickled():
    back = roundtrip({"fn": len, "obj": object()})
    assert isinstance(back["fn"], Opaque) and "builtin" in back["fn"].type
    assert isinstance(back["obj"], Opaque)


def test_tensor_leaf_keeps_dtype_name_for_numpy_less_types():
    leaves = to_leaves(torch.ones(2, dtype=torch.bfloat16))
    assert isinstance(leaves, TensorLeaf) and leaves.dtype == "bfloat16"
    assert leaves.data.dtype == np.int16


def test_hashable_keys_of_every_kind_round_trip():
    """Tuple, bytes and numpy-scalar keys were readable before the reader checked manifests."""
    tree = {(1, "a"): 1, b"k": 2, np.int64(3): 3, Pair(1, 2): 4, None: 5, 2.5: 6, (1, (2, 3)): 7}
    assert roundtrip(tree) == tree


def test_a_sparse_gpu_batch_copied_to_the_host_keeps_its_device_in_its_leaf():
    """copy_tree copies a CUDA sparse batch to the host as it is and marks where it lived (a
    dense pinned buffer cannot take it); its leaf, made dense, keeps that device and its layout,
    so a replay puts the graph back on the GPU, sparse. (The copy itself runs in make gpu-check's
    sparse case; this is the host side of it.)"""
    host = torch.eye(4).to_sparse()
    host._replay_device = "cuda:1"  # what copy_tree's CUDA branch sets on the host copy
    host._replay_grad = False
    leaf = to_leaves({"adj": host})["adj"]
    assert (leaf.device, leaf.layout) == ("cuda:1", "sparse_coo")
    assert np.array_equal(leaf.data, np.eye(4, dtype=np.float32))

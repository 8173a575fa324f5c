"""``TensorLeaf.values``: the one place a recorded bfloat16 leaf (kept as its uint16 bits) becomes
numbers, for every reader without torch (the TUI's batch view, doctor)."""

from __future__ import annotations

import math

import numpy as np
import torch

from replay.capture.tensors import copy_tree, to_leaves
from replay.store.tree import TensorLeaf
from replay_tui.batchstats import batch_leaves


def test_a_bfloat16_leaf_reads_as_the_numbers_torch_holds():
    x = torch.tensor([[1.5, -2.0, math.inf], [math.nan, 3.0e38, 1e-3]], dtype=torch.bfloat16)
    leaf = to_leaves(copy_tree({"x": x}))["x"]
    assert isinstance(leaf, TensorLeaf) and leaf.dtype == "bfloat16"
    assert leaf.values.dtype == np.float32
    np.testing.assert_array_equal(leaf.values, x.float().numpy())
    (stats,) = batch_leaves({"x": leaf})  # the TUI's per-sample rows
    assert stats.dtype == "bfloat16" and stats.nonfinite.tolist() == [1, 1]
    assert stats.absmax[0] == 2.0


def test_other_leaves_and_a_bfloat16_leaf_of_the_wrong_width_read_as_stored():
    f32 = TensorLeaf("float32", np.array([1.0, 2.0], dtype=np.float32))
    assert f32.values is f32.data
    odd = TensorLeaf("bfloat16", np.array([1.0, 2.0]))  # a damaged file's float64 "bfloat16"
    np.testing.assert_array_equal(odd.values, [1.0, 2.0])

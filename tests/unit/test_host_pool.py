"""The host buffer pool behind the batch copies: exact copies, reuse, and a bounded idle size."""

from __future__ import annotations

import numpy as np
import torch

from replay.capture.pool import HostPool
from replay.capture.tensors import CopyStats, copy_tree


def test_a_pooled_copy_is_bitwise_the_original_and_owns_its_memory():
    pool = HostPool()
    for t in (
        torch.randn(4, 5),
        torch.randn(3, 2).to(torch.bfloat16),
        torch.tensor([True, False]),
        torch.arange(7, dtype=torch.int8),
    ):
        out = pool.copy(t)
        assert out.dtype == t.dtype and out.shape == t.shape
        assert torch.equal(out.view(torch.uint8), t.view(torch.uint8))
        assert out.data_ptr() != t.data_ptr()


def test_a_given_back_buffer_is_the_next_copy_of_that_shape():
    pool = HostPool()
    a = pool.copy(torch.zeros(8, 8))
    pool.give([a])
    b = pool.copy(torch.ones(8, 8))
    assert b.data_ptr() == a.data_ptr() and bool((b == 1).all())
    other = pool.copy(torch.ones(8, 4))  # another shape: a fresh buffer
    assert other.data_ptr() != a.data_ptr()
    assert (pool.hits, pool.misses) == (1, 2)


def test_idle_buffers_are_capped_least_recently_used_shape_first():
    pool = HostPool(max_bytes=3 * 400)
    old = [pool.copy(torch.zeros(100)) for _ in range(2)]  # 400 bytes each
    pool.give(old)
    pool.give([pool.copy(torch.zeros(50, 2))])  # 400 bytes, newer shape
    assert pool.idle_bytes == 1200
    pool.give([pool.copy(torch.zeros(10, 10))])  # would make 1600: the oldest shape goes
    assert pool.idle_bytes == 800
    pool.give([torch.zeros(1000)])  # larger than the cap: never kept
    assert pool.idle_bytes == 800
    assert pool.copy(torch.zeros(100)).data_ptr() not in {t.data_ptr() for t in old}


def test_copy_tree_pools_plain_tensors_and_arrays_and_clones_the_rest():
    pool, stats = HostPool(), CopyStats()
    w = torch.randn(3, requires_grad=True)
    batch = {
        "x": torch.randn(4, 3),
        "strided": torch.randn(3, 4).t(),
        "w": w,
        "np": np.arange(6.0).reshape(2, 3),
        "obj": np.array([{"a": 1}], dtype=object),
        "s": "label",
    }
    out = copy_tree(batch, stats=stats, pool=pool)
    assert {id(t) for t in stats.pooled} == {id(out["x"]), id(out["np"])}
    assert torch.equal(out["x"], batch["x"]) and np.array_equal(out["np"], batch["np"])
    assert out["strided"].stride() == batch["strided"].stride()  # clone keeps the layout
    assert out["w"]._replay_grad and not out["w"].requires_grad
    assert out["obj"][0] == {"a": 1} and out["s"] == "label"
    assert stats.nbytes == 4 * 3 * 4 + 12 * 4 + 3 * 4 + 6 * 8 + out["obj"].nbytes


def test_the_snapshot_arena_takes_parameters_and_reuses_their_buffers():
    # issue 43 item 3: a snapshot copied the whole state into fresh memory every time
    arena = HostPool(1 << 62, state=True)
    w = torch.randn(64, 32, requires_grad=True)
    first = CopyStats()
    out = copy_tree({"w": w, "n": torch.tensor(3)}, stats=first, pool=arena)
    assert torch.equal(out["w"], w.detach()) and out["w"].data_ptr() != w.data_ptr()
    assert out["w"]._replay_grad is True and out["n"]._replay_grad is False
    assert not out["w"].requires_grad and len(first.pooled) == 2
    arena.give(first.pooled)  # the writer thread, once the snapshot is sent
    with torch.no_grad():
        w.add_(1.0)
    again = copy_tree({"w": w, "n": torch.tensor(3)}, stats=CopyStats(), pool=arena)
    assert again["w"].data_ptr() == out["w"].data_ptr()  # the same memory, the new values
    assert torch.equal(again["w"], w.detach()) and (arena.hits, arena.misses) == (2, 2)

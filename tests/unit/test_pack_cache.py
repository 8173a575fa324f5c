"""A reused manifest (store/writer.py ``PackCache``) gives byte for byte what a fresh encoding
gives, whatever changed between two records, including what equality alone would miss."""

from __future__ import annotations

import collections

import numpy as np

from replay.store.tree import SPLICE_MARK, Opaque, Spliced, TensorLeaf, layout_key
from replay.store.writer import PackCache, pack_parts

Point = collections.namedtuple("Point", "x y")
Other = collections.namedtuple("Other", "x y")


def _record(**change):
    tree = {
        "step": Spliced(),
        "rng": {"state": np.arange(4, dtype=np.uint64), "pos": 3, "gauss": 0.0, "v": None},
        "hparams": Spliced(),
        "batch": (TensorLeaf("float32", np.ones((2, 3), np.float32)), np.zeros(2, np.int64)),
        "values": {"it": 1, "tag": "a"},
    }
    tree.update(change)
    return tree


# Each differs from the one before it in a way that changes the manifest but not its length,
# or not the equality of python values (True == 1, -0.0 == 0.0, (1, 2) == [1, 2]).
VARIANTS = [
    {},
    {},  # the same layout: reused
    {"values": {"it": True, "tag": "a"}},
    {"values": {"it": 1, "tag": "b"}},
    {"rng": {"state": np.arange(4, dtype=np.uint64), "pos": 3, "gauss": -0.0, "v": None}},
    {"rng": {"state": np.arange(4, dtype=np.int64), "pos": 3, "gauss": 0.0, "v": None}},
    {"rng": {"pos": 3, "state": np.arange(4, dtype=np.uint64), "gauss": 0.0, "v": None}},
    {"batch": (TensorLeaf("float32", np.ones((3, 2), np.float32)), np.zeros(2, np.int64))},
    {"batch": (TensorLeaf("int32", np.ones((3, 2), np.int32)), np.zeros(2, np.int64))},
    {"batch": [TensorLeaf("int32", np.ones((3, 2), np.int32)), np.zeros(2, np.int64)]},
    {"batch": Point(TensorLeaf("bfloat16", np.ones(2, np.uint16)), np.zeros(2, np.int64))},
    {"batch": Other(TensorLeaf("bfloat16", np.ones(2, np.uint16)), np.zeros(2, np.int64))},
    {"batch": (TensorLeaf("float32", np.ones(3, np.float32), requires_grad=True),)},
    {"batch": (TensorLeaf("float32", np.ones((4, 4), np.float32)[:, 1]),)},  # not contiguous
    {"values": collections.OrderedDict(it=1, tag="a")},
    {"values": {"it": np.int64(1), "raw": b"\x00\x01", "obj": Opaque("x.Y", "Y()")}},
    {"values": {"it": 2**60, "tag": "a"}},
    {"values": None},
    {},
]


def _same_as_fresh(cache, tree, i):
    splices = (f'{{"t":"int","v":{i}}}', '{"t":"none"}')
    parts, mlen = cache.pack(tree, splices)
    fresh, fresh_mlen = pack_parts(tree, splices)
    assert mlen == fresh_mlen, i
    assert b"".join(p.tobytes() for p in parts) == b"".join(p.tobytes() for p in fresh), i
    assert SPLICE_MARK.encode() not in parts[0].tobytes()


def test_a_reused_manifest_gives_the_bytes_a_fresh_encoding_gives():
    cache = PackCache()
    for i, change in enumerate(VARIANTS):  # one after the other
        _same_as_fresh(cache, _record(**change), i)
    for i, change in enumerate(VARIANTS):  # each right after the base record
        cache = PackCache()
        _same_as_fresh(cache, _record(), 0)
        _same_as_fresh(cache, _record(**change), i)


def test_the_layout_key_tells_apart_what_python_equality_does_not():
    def key(tree):
        k, bufs = [], []
        assert layout_key(tree, k, bufs)
        return k

    assert key({"a": True}) != key({"a": 1})
    assert key({"a": -0.0}) != key({"a": 0.0})
    assert key([1, 2]) != key((1, 2))
    assert key(Point(1, 2)) != key(Other(1, 2))
    assert key(np.zeros((2, 3))) != key(np.zeros((3, 2)))
    assert key({"a": 1, "b": 2}) != key({"b": 2, "a": 1})
    assert key({"a": np.zeros(3)}) == key({"a": np.ones(3)})  # the bytes are not the layout

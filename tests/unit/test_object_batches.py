"""Batches that are objects (store/tree.py ObjectRecord): a dataclass, a UserDict (Hugging Face's
BatchEncoding), a plain object holding tensors (torch_geometric's Data-like). Was: stored as
opaque, so no step of such a run replayed ("'Opaque' object has no attribute 'x'")."""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from replay.capture.tensors import copy_tree, from_leaves, to_leaves
from replay.engine.classes import OwnClasses
from replay.store.tree import ObjectRecord, Opaque, decode, encode
from replay.store.validate import check_tree
from replay.trace.picture import batch_leaves, batch_nonfinite
from replay.trace.samples import slice_batch


@dataclass(frozen=True, slots=True)
class Pair:
    x: torch.Tensor
    y: torch.Tensor


class Encoding(collections.UserDict):
    """BatchEncoding's shape: a UserDict whose keys read as attributes too."""

    def __getattr__(self, name):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


class Graph:
    def __init__(self, x, edge_index, y):
        self.x, self.edge_index, self.y = x, edge_index, y


class Holder:
    def __init__(self):
        self.fn = print  # not data: the object stays opaque


def roundtrip(batch):
    manifest, bufs = encode(to_leaves(copy_tree(batch)))
    manifest = json.loads(json.dumps(manifest))  # as the file holds it
    data = b"".join(bytes(b) for b in bufs)
    check_tree(manifest, len(data), "test")
    return from_leaves(decode(manifest, data), classes=OwnClasses([__file__]))


@pytest.mark.parametrize(
    "batch",
    [
        Pair(torch.randn(4, 3), torch.arange(4)),
        Encoding({"input_ids": torch.arange(8).view(4, 2), "mask": torch.ones(4, 2)}),
        Graph(torch.randn(4, 3), torch.tensor([[0, 1], [1, 2]]), torch.arange(4)),
    ],
    ids=["dataclass", "userdict", "object"],
)
def test_an_object_batch_comes_back_as_its_own_class_bit_for_bit(batch):
    back = roundtrip(batch)
    assert type(back) is type(batch)
    want = dict(batch_leaves(batch))
    got = dict(batch_leaves(back))
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_a_copy_does_not_alias_the_batch_and_the_leaves_are_named_as_code_reads_them():
    b = Pair(torch.zeros(4, 3), torch.arange(4))
    copied = copy_tree(b)
    b.x.add_(1)  # the step writes its batch in place after the recorder copied it
    assert float(roundtrip(copied).x.sum()) == 0.0
    bad = Pair(torch.tensor([[0.0], [float("nan")]]), torch.arange(2))
    assert [d["name"] for d in batch_nonfinite(bad)] == ["batch.x"]
    assert [p for p, _ in batch_leaves(Encoding({"ids": torch.ones(2)}))] == ["data.ids"]
    half = slice_batch(Graph(torch.randn(4, 3), torch.tensor([[0, 1]]), torch.arange(4)), [1, 3])
    assert type(half) is Graph and half.y.tolist() == [1, 3] and half.x.shape == (2, 3)


def test_an_object_that_is_not_data_stays_opaque_and_an_unloaded_class_is_a_stand_in():
    manifest, _ = encode(Holder())
    assert manifest["t"] == "opaque"
    rec = ObjectRecord("no_such_module_loaded", "Thing", {"x": np.arange(3)})
    manifest, bufs = encode(rec)
    back = from_leaves(decode(manifest, b"".join(bytes(b) for b in bufs)))
    assert type(back).__name__ == "Thing" and back.x.tolist() == [0, 1, 2]
    assert isinstance(decode(*_opaque_roundtrip()), Opaque)


def _opaque_roundtrip():
    manifest, bufs = encode(Holder())
    return manifest, b"".join(bytes(b) for b in bufs)


def test_an_object_node_with_unusable_attributes_is_refused():
    from replay.errors import RecordingError

    for bad in (
        {"t": "object", "module": "m", "qualname": "C", "k": ["__class__"], "v": [{"t": "none"}]},
        {"t": "object", "module": "m", "qualname": "C", "k": ["a b"], "v": [{"t": "none"}]},
        {"t": "object", "module": "m", "qualname": "C", "k": ["a"], "v": []},
        {"t": "object", "module": 3, "qualname": "C", "k": [], "v": []},
    ):
        with pytest.raises(RecordingError, match="object node"):
            check_tree(bad, 0, "test")


class Scratch:
    """A class of the program's own with a finaliser: made from a file's attributes, it would
    delete whatever ``path`` the file names."""

    def __del__(self):
        import os

        os.unlink(self.path)


def _rebuilt(rec: ObjectRecord, files: list[str]):
    manifest, bufs = encode(rec)
    manifest = json.loads(json.dumps(manifest))
    return from_leaves(
        decode(manifest, b"".join(bytes(b) for b in bufs)), classes=OwnClasses(files)
    )


def test_a_gadget_class_is_not_built_and_its_finaliser_never_runs(tmp_path):
    """Was: a batch recorded as tempfile._TemporaryFileCloser (a loaded class) was made as one
    without its constructor, and its finaliser deleted the file the batch named."""
    import gc
    import tempfile
    import types

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    inner = ObjectRecord("tempfile", "_TemporaryFileCloser", {})
    gadgets = [
        # the standard library's: not the program's own class
        ObjectRecord(
            "tempfile", "_TemporaryFileCloser", {"file": inner, "name": str(victim), "delete": True}
        ),
        # the program's own, with a finaliser
        ObjectRecord(__name__, "Scratch", {"path": str(victim)}),
        # a name the program's module re-exports is not where the class is defined
        ObjectRecord(__name__, "collections.UserDict", {"data": {}}),
    ]
    for rec in gadgets:
        back = _rebuilt(rec, [__file__])
        assert not isinstance(back, (tempfile._TemporaryFileCloser, Scratch, collections.UserDict))
        assert isinstance(back, types.SimpleNamespace) and vars(back).keys() == rec.attrs.keys()
        del back
        gc.collect()
        assert victim.read_text() == "mine"


def test_a_class_of_the_program_is_built_only_from_its_own_files(tmp_path):
    """A dataclass of the program's file is its own class; the same record replayed for a
    program elsewhere (this file is then not the program's) is a stand-in."""
    rec = ObjectRecord(__name__, "Pair", {"x": np.zeros(2), "y": np.ones(2)})
    assert type(_rebuilt(rec, [__file__])) is Pair
    assert type(_rebuilt(rec, [str(tmp_path / "train.py")])) is not Pair


def test_the_one_walker_rebuilds_every_container_and_reaches_the_tensors_inside_objects():
    """Every walk of a batch is the store's (``map_tree``, ``leaves``): each container comes
    back as it was, a frozen slotted dataclass and a UserDict included, and each leaf is named
    as ``leaf_path`` says. Was: walks by hand, and the engine's copy of a replayed batch and
    the framework callbacks' copies skipped the tensors of an object batch (and a
    namedtuple's, in the callbacks)."""
    from replay.capture.tensors import host_leaves
    from replay.integrations._recording import clone_batch
    from replay.store.tree import leaf_path, leaves, map_tree

    Row = collections.namedtuple("Row", "ids mask")
    batch = collections.OrderedDict(
        pair=Pair(torch.zeros(2), torch.ones(2)),
        rest=[Encoding({"ids": torch.arange(3)}), Row(torch.ones(1), None), (np.zeros(2), "s")],
    )
    names = [leaf_path(k) for k, _ in leaves(batch)]
    assert names == ["pair.x", "pair.y", "rest[0].data.ids"] + [
        "rest[1].ids",
        "rest[1].mask",
        "rest[2][0]",
        "rest[2][1]",
    ]
    plus_zero = map_tree(lambda x: x + 0 if isinstance(x, torch.Tensor) else x, batch)
    for copy in (plus_zero, clone_batch(batch)):
        assert type(copy) is collections.OrderedDict and type(copy["pair"]) is Pair
        assert type(copy["rest"][0]) is Encoding and type(copy["rest"][1]) is Row
        assert [leaf_path(k) for k, _ in leaves(copy)] == names
        copy["pair"].x.add_(1)  # the step writes its batch in place
        copy["rest"][0]["ids"].add_(1)
        copy["rest"][1].ids.add_(1)
    assert float(batch["pair"].x.sum()) == 0.0 and batch["rest"][0]["ids"].tolist() == [0, 1, 2]
    assert batch["rest"][1].ids.tolist() == [1.0]
    # a tensor off the host inside an object batch is seen (was: the step log took the batch
    # as host memory and read it back from the device on the training thread)
    assert host_leaves(batch) is not None
    assert host_leaves(Pair(torch.empty(2, device="meta"), torch.ones(2))) is None

"""Encoding nested Python structures into a JSON manifest plus one byte arena (numpy only).

A *tree* is any nesting of dict / list / tuple / namedtuple whose leaves are numpy arrays,
:class:`TensorLeaf` (a tensor as raw bytes, so bfloat16 round-trips), python scalars, strings,
bytes and ``None``. ``encode`` returns the manifest (JSON-able) and the byte buffers to place in the
arena; ``decode`` rebuilds the tree from the manifest and the arena bytes, bit for bit.

A dataclass instance, a ``collections.UserDict`` (Hugging Face's ``BatchEncoding``) or a plain
object whose attributes are all data (tensors, arrays, numbers, strings, containers of them) is
an :class:`ObjectRecord`: its class's module and qualified name and its attributes. It comes
back as that record; ``capture.tensors.from_leaves`` makes it the object again in a replay, from
its class where the replayed program has it loaded (never importing a module a file names).

No pickle: an object of any other type is stored as :class:`Opaque` (its type name and ``repr``)
and comes back as such, never as the object.

Every walk of such a tree, live (tensors, objects) or read back (leaves, records), is this
module's: ``map_tree`` rebuilds it with each leaf mapped, ``leaves`` yields each leaf with its
keys, ``leaf_path`` names a leaf.

Example::

    >>> manifest, bufs = encode({"x": np.arange(3, dtype=np.int16), "name": "a"})
    >>> data = b"".join(bytes(b) for b in bufs)
    >>> decode(manifest, data)["x"].tolist()
    [0, 1, 2]
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "TensorLeaf",
    "SPARSE_LAYOUTS",
    "Opaque",
    "ObjectRecord",
    "record_of",
    "Spliced",
    "SPLICE_MARK",
    "Keyed",
    "encode",
    "layout_key",
    "decode",
    "Key",
    "map_tree",
    "keep_kind",
    "as_record",
    "leaves",
    "iter_leaves",
    "leaf_path",
]


@dataclass
class TensorLeaf:
    """A tensor reduced to numpy: ``data`` holds its bytes (bfloat16 as a ``uint16`` view).

    ``dtype`` is the torch dtype name without the ``torch.`` prefix (``"bfloat16"``).
    """

    dtype: str
    data: np.ndarray
    device: str = "cpu"
    requires_grad: bool = False
    # The tensor's strides (in elements) where it was not contiguous (a channels_last or
    # transposed batch): a replay lays its values out so again. ``data`` is the values.
    strides: tuple[int, ...] | None = None
    # A sparse tensor's layout (``"sparse_coo"``, ``"sparse_csr"``, ...); ``data`` holds its
    # values dense, and a replay makes it sparse again (ops give other bits on a dense one).
    layout: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def values(self) -> np.ndarray:
        """``data`` as numbers: bfloat16's ``uint16`` bits widened to float32 (numpy has none)."""
        if self.dtype == "bfloat16" and self.data.dtype.itemsize == 2:
            return (self.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return self.data


@dataclass
class Opaque:
    """Stand-in for a value the format cannot hold (a function, an arbitrary object)."""

    type: str
    repr: str = field(default="")


@dataclass
class ObjectRecord:
    """An object of the batch kept as its class's name and its attributes (see the module
    docstring); ``attrs`` holds them as the tree does everything else."""

    module: str
    qualname: str
    attrs: dict[str, Any]


#: The sparse layouts a tensor leaf may name (``TensorLeaf.layout``): a replay makes each again
#: with ``to_sparse(layout=...)``, which needs no block size.
SPARSE_LAYOUTS = ("sparse_coo", "sparse_csr", "sparse_csc")

_DATA = (str, int, float, complex, bool, bytes, type(None))
_MAX_ATTRS = 64  # attributes of a plain object kept as a record (more: not a batch's)


def record_of(obj: Any, convert: Any) -> ObjectRecord | None:
    """``obj`` as an :class:`ObjectRecord` with ``convert`` applied to each attribute, or
    ``None`` when it is not one the format keeps so (see the module docstring). ``convert`` is
    the caller's walk (a copy, the leaves)."""
    import dataclasses

    cls = type(obj)
    if isinstance(obj, type) or cls.__module__.split(".")[0] in ("builtins", "torch", "numpy"):
        return None  # (a module, a tensor subclass, a generator: never a batch's record)
    if dataclasses.is_dataclass(obj):
        names = [f.name for f in dataclasses.fields(obj)]
    elif isinstance(obj, collections.UserDict) or (
        isinstance(getattr(obj, "__dict__", None), dict)
        and 0 < len(vars(obj)) <= _MAX_ATTRS
        and all(_is_data(v, 3) for v in vars(obj).values())
    ):
        names = list(vars(obj))
    else:
        return None
    attrs = {n: convert(getattr(obj, n)) for n in names if n[:2] != "__" and hasattr(obj, n)}
    return ObjectRecord(cls.__module__, cls.__qualname__, attrs)


def _is_data(v: Any, depth: int) -> bool:
    """A value a batch holds: a tensor or an array (by type name: this module has no torch),
    a scalar, a string, or a container of them."""
    if isinstance(v, (*_DATA, np.ndarray)) or type(v).__name__ == "Tensor":
        return True
    if hasattr(v, "__torch_function__"):  # a tensor subclass (a Parameter)
        return True
    if depth <= 0:
        return False
    if isinstance(v, dict):
        return all(_is_data(x, depth - 1) for x in v.values())
    if isinstance(v, (list, tuple)):
        return all(_is_data(x, depth - 1) for x in v[:64])
    return False


class Spliced:
    """Stands in the tree for a subtree whose manifest JSON the caller already holds (one with
    no buffers: its text does not depend on where it sits). It is encoded as ``SPLICE_MARK``,
    which the caller replaces by that text: the manifest is the same as if the subtree had been
    encoded in its place. The mark cannot come from data: every string in the manifest is a JSON
    string, its quotes escaped. Several marks are replaced in the order the encoder meets them
    (dicts: keys first, then values, in insertion order)."""


SPLICE_MARK = '{"t":"spliced"}'


@dataclass
class Keyed:
    """Stands in the tree for ``tree`` with its :func:`layout_key` already worked out (``key``,
    one item of the key, and ``buffers``, in ``encode``'s order): ``layout_key`` takes them as
    they are instead of walking ``tree``; ``encode`` encodes ``tree``. The caller keeps them
    from a walk of a subtree whose layout it knows unchanged (a step's RNG states: the
    generators' sizes never change, ``record/step_log_writer.py``)."""

    tree: Any
    key: Any
    buffers: list[np.ndarray | bytes]


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


class _Encoder:
    def __init__(self) -> None:
        self.buffers: list[np.ndarray | bytes] = []
        self.offset = 0

    def _place(self, buf: np.ndarray | bytes) -> tuple[int, int]:
        n = buf.nbytes if isinstance(buf, np.ndarray) else len(buf)
        off = self.offset
        self.buffers.append(buf)
        self.offset += n
        return off, n

    def leaf_array(self, arr: np.ndarray) -> dict[str, Any]:
        if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            arr = np.ascontiguousarray(arr).reshape(arr.shape)
        off, n = self._place(arr)
        return {"dtype": arr.dtype.str, "shape": list(arr.shape), "off": off, "n": n}

    def node(self, obj: Any) -> dict[str, Any]:
        # Order matters: bool before int, namedtuple before tuple.
        if obj is None:
            return {"t": "none"}
        if isinstance(obj, Spliced):
            return {"t": "spliced"}
        if isinstance(obj, Keyed):
            return self.node(obj.tree)
        if isinstance(obj, TensorLeaf):
            d = self.leaf_array(obj.data)
            d.update(t="tensor", tdtype=obj.dtype, device=obj.device, grad=obj.requires_grad)
            if obj.strides is not None:
                d["strides"] = list(obj.strides)
            if obj.layout is not None:
                d["layout"] = obj.layout
            return d
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                return {"t": "opaque", "type": "numpy.ndarray[object]", "repr": repr(obj)[:200]}
            return {**self.leaf_array(obj), "t": "ndarray"}
        if isinstance(obj, np.generic):
            return {**self.leaf_array(np.asarray(obj)), "t": "npscalar"}
        if isinstance(obj, bool):
            return {"t": "bool", "v": obj}
        if isinstance(obj, int):
            return {"t": "int", "v": str(obj) if abs(obj) >= 2**53 else obj}
        if isinstance(obj, float):
            return {"t": "float", "v": obj.hex()}
        if isinstance(obj, complex):
            return {"t": "complex", "v": [obj.real.hex(), obj.imag.hex()]}
        if isinstance(obj, str):
            return {"t": "str", "v": obj}
        if isinstance(obj, (bytes, bytearray)):
            off, n = self._place(bytes(obj))
            return {"t": "bytes", "off": off, "n": n}
        if isinstance(obj, dict):
            kind = "odict" if isinstance(obj, collections.OrderedDict) else "dict"
            return {
                "t": kind,
                "k": [self.node(k) for k in obj],
                "v": [self.node(v) for v in obj.values()],
            }
        if _is_namedtuple(obj):
            cls = type(obj)
            return {
                "t": "ntuple",
                "name": cls.__name__,
                "module": getattr(cls, "__module__", ""),
                "qualname": getattr(cls, "__qualname__", cls.__name__),
                "fields": list(cls._fields),
                "v": [self.node(v) for v in obj],
            }
        if isinstance(obj, tuple):
            return {"t": "tuple", "v": [self.node(v) for v in obj]}
        if isinstance(obj, list):
            return {"t": "list", "v": [self.node(v) for v in obj]}
        if isinstance(obj, Opaque):
            return {"t": "opaque", "type": obj.type, "repr": obj.repr}
        if not isinstance(obj, ObjectRecord):
            obj = record_of(obj, _same) or obj
        if isinstance(obj, ObjectRecord):
            return {
                "t": "object",
                "module": obj.module,
                "qualname": obj.qualname,
                "k": list(obj.attrs),
                "v": [self.node(v) for v in obj.attrs.values()],
            }
        cls = type(obj)
        return {
            "t": "opaque",
            "type": f"{cls.__module__}.{cls.__qualname__}",
            "repr": repr(obj)[:200],
        }


def encode(tree: Any) -> tuple[dict[str, Any], list[np.ndarray | bytes]]:
    """Return ``(manifest, buffers)``; buffer offsets in the manifest are relative to the first."""
    enc = _Encoder()
    manifest = enc.node(tree)
    return manifest, enc.buffers


def layout_key(obj: Any, key: list[Any], buffers: list[np.ndarray | bytes]) -> bool:
    """Append to ``key`` everything ``encode`` would write into the manifest for ``obj`` (types,
    dtypes, shapes, scalar values; buffer offsets follow from the sizes), and to ``buffers`` the
    buffers in the order ``encode`` places them. Two trees with equal keys have the same
    manifest, so its text can be reused: a step's record has the same layout step after step.

    ``False``: a node this does not cover exactly (a subclass, an opaque object, an array that
    is not contiguous), for which ``encode`` must run. Types are compared exactly (``True`` is not
    ``1``); floats by their hex text (``-0.0`` is not ``0.0``), as the manifest writes them.
    """
    t = type(obj)
    if obj is None or t is Spliced:
        key.append(t)
    elif t is Keyed:
        key.append(obj.key)
        buffers.extend(obj.buffers)
    elif t is TensorLeaf:
        a = obj.data
        if type(a) is not np.ndarray or not a.flags.c_contiguous:
            return False
        key.append((t, obj.dtype, a.dtype.str, a.shape, obj.device, obj.requires_grad, obj.strides))
        if obj.layout is not None:
            key.append(obj.layout)
        buffers.append(a)
    elif t is np.ndarray:
        if obj.dtype.hasobject or not obj.flags.c_contiguous:
            return False
        key.append((t, obj.dtype.str, obj.shape))
        buffers.append(obj)
    elif t is str or t is int or t is bool:
        key.append((t, obj))
    elif t is float:
        key.append((t, obj.hex()))
    elif t is dict or t is collections.OrderedDict:
        key.append((t, len(obj)))
        for k in obj:
            if type(k) is str:  # (as below: a call less for every key of the record)
                key.append((str, k))
            elif not layout_key(k, key, buffers):
                return False
        for v in obj.values():
            if not layout_key(v, key, buffers):
                return False
    elif t is tuple or t is list or _is_namedtuple(obj):
        key.append((t, len(obj)))
        for v in obj:
            if not layout_key(v, key, buffers):
                return False
    else:
        return False
    return True


_NT_CACHE: dict[tuple[str, tuple[str, ...]], type] = {}


def _namedtuple_type(name: str, fields: list[str], module: str, qualname: str) -> type:
    key = (f"{module}:{qualname}", tuple(fields))
    if key not in _NT_CACHE:
        _NT_CACHE[key] = collections.namedtuple(
            name if name.isidentifier() else "Record", fields, rename=True
        )
    return _NT_CACHE[key]


def _array(node: dict[str, Any], data: memoryview | bytes) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8, count=node["n"], offset=node["off"])
    out: np.ndarray = raw.view(np.dtype(node["dtype"])).reshape(node["shape"]).copy()
    return out


def _layout(name: Any) -> str | None:
    """A tensor node's ``layout`` (a MAY key; absent, the tensor is dense): a sparse layout this
    reader makes again, else ``None`` (the file is untrusted: any other value, dense)."""
    return name if isinstance(name, str) and name in SPARSE_LAYOUTS else None


def decode(node: dict[str, Any], data: memoryview | bytes) -> Any:
    """Rebuild the tree described by ``node`` from the arena bytes ``data``."""
    t = node["t"]
    if t == "none":
        return None
    if t == "tensor":
        strides = node.get("strides")  # (v4; absent: contiguous)
        return TensorLeaf(
            node["tdtype"],
            _array(node, data),
            node["device"],
            node["grad"],
            None if strides is None else tuple(strides),
            _layout(node.get("layout")),
        )
    if t == "ndarray":
        return _array(node, data)
    if t == "npscalar":
        return _array(node, data)[()]
    if t in ("bool", "str"):
        return node["v"]
    if t == "int":
        return int(node["v"])
    if t == "float":
        return float.fromhex(node["v"])
    if t == "complex":
        return complex(float.fromhex(node["v"][0]), float.fromhex(node["v"][1]))
    if t == "bytes":
        return bytes(np.frombuffer(data, dtype=np.uint8, count=node["n"], offset=node["off"]))
    if t in ("dict", "odict"):
        items = zip((decode(k, data) for k in node["k"]), (decode(v, data) for v in node["v"]))
        return collections.OrderedDict(items) if t == "odict" else dict(items)
    if t == "ntuple":
        cls = _namedtuple_type(node["name"], node["fields"], node["module"], node["qualname"])
        return cls(*(decode(v, data) for v in node["v"]))
    if t == "tuple":
        return tuple(decode(v, data) for v in node["v"])
    if t == "list":
        return [decode(v, data) for v in node["v"]]
    if t == "opaque":
        return Opaque(node["type"], node.get("repr", ""))
    if t == "object":
        values = (decode(v, data) for v in node["v"])
        return ObjectRecord(node["module"], node["qualname"], dict(zip(node["k"], values)))
    raise ValueError(f"unknown tree node type {t!r}")


Key = tuple[str, Any]  # ("map", a dict key) | ("seq", a position) | ("attr", a name)

# Nodes that are leaves whatever they hold (the objects below are walked by their attributes).
_LEAVES = (TensorLeaf, np.ndarray, *_DATA, bytearray, np.generic, Opaque, Spliced)
_LEAF, _DICT, _ODICT, _LIST, _TUPLE, _NTUPLE, _RECORD, _OBJECT = range(1, 9)
_KINDS: dict[type, int] = {}  # what a node of each type is to the walk, found once a type


def _kind(x: Any) -> int:
    cls = type(x)
    if len(_KINDS) > 4096:  # (classes made on the fly: a replay's stand-ins)
        _KINDS.clear()
    if issubclass(cls, dict):
        k = _ODICT if issubclass(cls, collections.OrderedDict) else _DICT
    elif issubclass(cls, (list, tuple)):
        k = _LIST if issubclass(cls, list) else _NTUPLE if hasattr(cls, "_fields") else _TUPLE
    elif issubclass(cls, _LEAVES) or hasattr(cls, "__torch_function__"):  # (a tensor: no torch)
        k = _LEAF
    else:
        k = _RECORD if cls is ObjectRecord else _OBJECT
    _KINDS[cls] = k
    return k


def keep_kind(node: Any, rec: ObjectRecord) -> Any:
    """An object node rebuilt as what it was: a record stays ``rec``; an object is a copy of
    itself with ``rec``'s attributes (its class's own ``__init__`` is not called)."""
    if isinstance(node, ObjectRecord):
        return rec
    out = copy.copy(node)
    for k, v in rec.attrs.items():
        object.__setattr__(out, k, v)
    return out


def as_record(node: Any, rec: ObjectRecord) -> ObjectRecord:
    """An object node rebuilt as its record (what the store holds)."""
    return rec


def map_tree(
    fn: Callable[[Any], Any],
    tree: Any,
    objects: Callable[[Any, ObjectRecord], Any] = keep_kind,
) -> Any:
    """``tree`` rebuilt with ``fn`` applied to every leaf: the one walk of a batch or value
    tree. Dicts (an ``OrderedDict`` stays one, another mapping becomes a ``dict``), lists,
    tuples and namedtuples are rebuilt as such; an :class:`ObjectRecord` or an object
    ``record_of`` takes (a dataclass, a ``UserDict``, a plain data object) is walked by its
    attributes and rebuilt by ``objects(node, record of the new attributes)``; anything else
    (a tensor, an array, a scalar, ``None``, an object of any other kind) is a leaf.

    >>> map_tree(lambda v: v * 2 if isinstance(v, int) else v, {"a": [1, (2, "x")]})
    {'a': [2, (4, 'x')]}
    """

    def walk(x: Any) -> Any:
        k = _KINDS.get(type(x)) or _kind(x)
        if k == _LEAF:
            return fn(x)
        if k in (_DICT, _ODICT):
            items = [(key, walk(v)) for key, v in x.items()]
            return dict(items) if k == _DICT else collections.OrderedDict(items)
        if k == _LIST:
            return [walk(v) for v in x]
        if k == _TUPLE:
            return tuple([walk(v) for v in x])
        if k == _NTUPLE:
            return type(x)(*[walk(v) for v in x])
        if k == _RECORD:
            return objects(x, ObjectRecord(x.module, x.qualname, walk(x.attrs)))
        rec = record_of(x, walk)
        return fn(x) if rec is None else objects(x, rec)

    return walk(tree)


def leaves(tree: Any, keys: tuple[Key, ...] = ()) -> Iterator[tuple[tuple[Key, ...], Any]]:
    """``(keys, leaf)`` of every leaf of ``tree`` in order, walked as :func:`map_tree` walks it;
    ``leaf_path(keys)`` names it."""
    k = _KINDS.get(type(tree)) or _kind(tree)
    if k == _LEAF:
        yield keys, tree
    elif k in (_DICT, _ODICT):
        for key, v in tree.items():
            yield from leaves(v, (*keys, ("map", key)))
    elif k in (_LIST, _TUPLE):
        for i, v in enumerate(tree):
            yield from leaves(v, (*keys, ("seq", i)))
    elif k == _NTUPLE:
        for name, v in zip(type(tree)._fields, tree):
            yield from leaves(v, (*keys, ("attr", name)))
    elif (rec := tree if k == _RECORD else record_of(tree, _same)) is not None:
        for name, v in rec.attrs.items():
            yield from leaves(v, (*keys, ("attr", name)))
    else:
        yield keys, tree


def _same(v: Any) -> Any:
    return v


def leaf_path(keys: Sequence[Key]) -> str:
    """The one name of a leaf inside a nested batch (the store, the trace and the TUI all name
    leaves so): a name (dict key, namedtuple field, attribute) after a dot, a position in
    brackets; ``batch`` for the batch itself.

    >>> leaf_path([("map", "x")]), leaf_path([("seq", 0)]), leaf_path([])
    ('x', '[0]', 'batch')
    >>> leaf_path([("map", "inputs"), ("seq", 1), ("attr", "ids")])
    'inputs[1].ids'
    """
    out = ""
    for kind, k in keys:
        out += f"[{k}]" if kind == "seq" else f".{k}" if out else str(k)
    return out or "batch"


def iter_leaves(tree: Any) -> Iterator[tuple[str, Any]]:
    """``(leaf_path, leaf)`` for every array-like leaf (a TensorLeaf, a numpy array, a tensor)."""
    for keys, leaf in leaves(tree):
        if isinstance(leaf, (TensorLeaf, np.ndarray)) or hasattr(leaf, "__torch_function__"):
            yield leaf_path(keys), leaf

"""Reading a file a stranger made: every check the readers apply before they allocate or read.

A recording (or a forensics sidecar) is untrusted input: it may come from a bug report, a shared
drive, anyone. HDF5 will happily follow an external link to ``/etc/passwd``, read "external raw
storage" from ``/dev/zero``, assemble a virtual dataset from other files, inflate a compressed
chunk a thousandfold, or hand back a 2^27-row dataset of fill values from a 747 KB file. And what
the readers then parse (JSON, record manifests) can be nested 100,000 deep, hold an array where a
number belongs, or point outside its arena. So, before anything is allocated or read:

- only regular files are opened (a FIFO would hang the reader, a device would never end);
- only hard links inside the file are followed; a dataset that is virtual, has external raw
  storage or any filter is refused (the format uses none of them);
- every dataset's dtype, rank and shape is checked against the layout and against its siblings
  (ring slots, health columns, status fields) and its size against a documented limit;
- attributes must be scalars of the expected kind; JSON is parsed with size and depth limits;
- ring markers, lengths and manifest offsets must lie within their rings and arenas, and every
  chunk of a payload must be stored in the file (so a read is bounded by the file's own size).

Any violation raises :class:`~replay.errors.RecordingError` (exit code 3) with one line naming
the file, the dataset and what is wrong. No torch here (the TUI reads through this module).

Example::

    ds = dataset(f, "steps/step", path, dtype="<i8", ndim=1)
    meta = parse_json(raw_bytes, where=f"{path}: /meta/run")
"""

from __future__ import annotations

import functools
import json
import math
import os
import stat
from typing import Any, TypeGuard

import h5py
import numpy as np

from ..errors import RecordingError, first_line

__all__ = [
    "LIMITS",
    "H5_ERRORS",
    "MAX_STEP",
    "MAX_WORLD_SIZE",
    "check_regular_file",
    "resolve",
    "dataset",
    "attr_str",
    "attr_int",
    "attr_float",
    "attr_json",
    "read_json_blob",
    "parse_json",
    "json_depth",
    "is_int",
    "check_markers",
    "check_payload_stored",
    "check_tree",
    "check_meta",
    "check_record",
    "check_sources",
]

# Limits, each far above what replay itself writes (documented in docs/format.md).
LIMITS = {
    "json_bytes": 64 << 20,  # one JSON blob: meta/run, meta/sources, a sidecar table
    "json_depth": 64,  # nesting of any JSON value (meta, verdict, string tables)
    "tree_depth": 100,  # nesting of a record manifest (a batch, a state dict)
    "tree_ndim": 32,  # dimensions of one array leaf
    "ring_slots": 1 << 22,  # slots of /steps or /snapshots
    "health_slots": 1 << 20,  # rows of /health (the recorder's default keep_health is 100,000)
    "health_columns": 256,
    "health_bytes": 256 << 20,  # /health/values, read whole (fill values cost memory too)
    "sidecar_json_bytes": 64 << 20,  # every JSON blob of a sidecar together (all read at open)
    "status_fields": 64,
    "attr_chars": 1 << 16,  # a string attribute
    "chunk_bytes": 64 << 20,  # one chunk of any dataset (the writer's arena chunks are <= 1 MiB)
    "ops_rows": 1 << 26,  # rows of a sidecar's /ops (read in ranges, never whole)
    "table_rows": 1 << 18,  # rows of a sidecar's /modules, /params (read whole)
}
MAX_STEP = 1 << 53  # steps are exact JSON integers; a marker beyond this is damage
MAX_WORLD_SIZE = 1 << 20  # ranks of a DDP run

_BAD = RecordingError
# What h5py raises when the HDF5 library fails on damaged metadata (a RuntimeError for some,
# e.g. "Can't deserialize object header prefix"): each becomes one RecordingError line.
H5_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)


def _fail(where: str, what: str) -> RecordingError:
    return _BAD(f"{where}: {what}")


# -- files -------------------------------------------------------------------------------------


def check_regular_file(path: str, what: str = "recording") -> os.stat_result:
    """``os.stat`` before any open: a FIFO would block the reader, a device never ends."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _BAD(f"{path}: no such file") from None
    except OSError as e:
        raise _BAD(f"{path}: cannot be read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise _BAD(f"{path}: is a directory, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        kind = {
            stat.S_IFIFO: "a FIFO",
            stat.S_IFCHR: "a device",
            stat.S_IFBLK: "a device",
            stat.S_IFSOCK: "a socket",
        }.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise _BAD(f"{path}: is {kind}, not a {what} (only regular files are opened)")
    return st


# -- objects and datasets ------------------------------------------------------------------------


def resolve(f: h5py.File, name: str, where: str) -> Any:
    """The object at ``name`` (``"steps/arena"``), following hard links only.

    External links (another file), soft links and user-defined links are refused: the format
    uses none, and an external link reads whatever file it names.
    """
    obj: Any = f
    for part in name.strip("/").split("/"):
        if not isinstance(obj, h5py.Group):
            raise _fail(where, f"/{name}: /{part}'s parent is not a group")
        try:
            link = obj.get(part, getlink=True)
        except H5_ERRORS as e:
            raise _fail(where, f"/{name}: unreadable link ({first_line(e)})") from None
        if link is None:
            raise _fail(where, f"damaged recording (missing /{name})")
        if not isinstance(link, h5py.HardLink):
            kind = type(link).__name__
            raise _fail(
                where, f"/{name} is reached through a link of type {kind}, which is refused"
            )
        try:
            obj = obj[part]
        except H5_ERRORS as e:
            raise _fail(where, f"/{name}: unreadable ({first_line(e)})") from None
    return obj


def _check_storage(ds: h5py.Dataset, where: str, name: str) -> None:
    try:
        virtual = ds.is_virtual
        dcpl = ds.id.get_create_plist()
        external = dcpl.get_external_count()
        filters = dcpl.get_nfilters()
    except H5_ERRORS as e:
        raise _fail(where, f"/{name}: unreadable layout ({first_line(e)})") from None
    if virtual:
        raise _fail(where, f"/{name} is a virtual dataset (data from other files), refused")
    if external > 0:
        raise _fail(where, f"/{name} keeps its data in external files, refused")
    if filters > 0:
        raise _fail(where, f"/{name} is filtered (compressed); the format uses no filters")


def dataset(
    f: h5py.File,
    name: str,
    where: str,
    *,
    dtype: str,
    ndim: int,
    shape: tuple[int | None, ...] | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    checked: set[str] | None = None,
) -> h5py.Dataset:
    """The dataset ``name``, checked: hard links, plain storage, exact ``dtype``, rank ``ndim``,
    the dimensions ``shape`` gives (``None`` for any), at most ``max_rows`` rows and
    ``max_bytes`` bytes. ``checked`` caches the link and storage checks (they cannot change in
    a file opened for reading); the shape is checked on every call (a live arena grows)."""
    if checked is not None and name in checked:
        ds = f[name]
    else:
        ds = resolve(f, name, where)
        if not isinstance(ds, h5py.Dataset):
            raise _fail(where, f"/{name} is not a dataset")
        _check_storage(ds, where, name)
        try:
            got = ds.dtype
        except H5_ERRORS as e:
            raise _fail(where, f"/{name} has an unreadable dtype ({first_line(e)})") from None
        if got != np.dtype(dtype) or got.str != np.dtype(dtype).str:
            raise _fail(where, f"/{name} has dtype {got}, expected {np.dtype(dtype)}")
        if ds.chunks is not None and math.prod(ds.chunks) * got.itemsize > LIMITS["chunk_bytes"]:
            raise _fail(
                where, f"/{name} has chunks of {ds.chunks} (at most {LIMITS['chunk_bytes']} bytes)"
            )
        if checked is not None:
            checked.add(name)
    if ds.ndim != ndim:
        raise _fail(where, f"/{name} has {ds.ndim} dimensions, expected {ndim}")
    if shape is not None:
        for i, (want, have) in enumerate(zip(shape, ds.shape)):
            if want is not None and want != have:
                raise _fail(where, f"/{name} has shape {ds.shape}, expected {want} along axis {i}")
    if max_rows is not None and ndim and ds.shape[0] > max_rows:
        raise _fail(where, f"/{name} claims {ds.shape[0]} rows (at most {max_rows} are read)")
    if max_bytes is not None:
        nbytes = math.prod(ds.shape) * ds.dtype.itemsize
        if nbytes > max_bytes:
            raise _fail(where, f"/{name} claims {nbytes} bytes (at most {max_bytes} are read)")
    return ds


# -- attributes ----------------------------------------------------------------------------------


def _attr(obj: Any, key: str, where: str, required: bool) -> Any:
    """Attribute ``key`` of ``obj`` as a scalar (a 0-d array unwrapped), None when it is
    missing and not ``required``."""
    try:  # (not .get: it takes a damaged attribute's KeyError for a missing attribute)
        v = obj.attrs[key] if key in obj.attrs else None  # noqa: SIM401
    except H5_ERRORS as e:
        raise _fail(
            where, f"attribute {key!r} of {obj.name} is unreadable ({first_line(e)})"
        ) from None
    if v is None and required:
        raise _fail(where, f"attribute {key!r} of {obj.name} is missing")
    if isinstance(v, np.ndarray):
        if v.shape != ():
            raise _fail(where, f"attribute {key!r} of {obj.name} is an array, expected a scalar")
        v = v[()]
    return v


def attr_str(obj: Any, key: str, where: str, *, required: bool = True) -> str | None:
    v = _attr(obj, key, where, required)
    if v is None:
        return None
    if isinstance(v, bytes):
        try:
            v = v.decode("utf-8")
        except UnicodeDecodeError:
            raise _fail(where, f"attribute {key!r} of {obj.name} is not UTF-8") from None
    if not isinstance(v, str):
        raise _fail(where, f"attribute {key!r} of {obj.name} is not a string")
    if len(v) > LIMITS["attr_chars"]:
        raise _fail(where, f"attribute {key!r} of {obj.name} is longer than {LIMITS['attr_chars']}")
    return v


def attr_int(obj: Any, key: str, where: str, *, lo: int, hi: int) -> int:
    v = _attr(obj, key, where, True)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise _fail(where, f"attribute {key!r} of {obj.name} is not an integer")
    v = int(v)
    if not lo <= v <= hi:
        raise _fail(where, f"attribute {key!r} of {obj.name} is {v}, outside [{lo}, {hi}]")
    return v


def attr_float(obj: Any, key: str, where: str) -> float:
    v = _attr(obj, key, where, True)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise _fail(where, f"attribute {key!r} of {obj.name} is not a number")
    return float(v)


def attr_json(obj: Any, key: str, where: str) -> Any:
    text = attr_str(obj, key, where)
    assert text is not None  # attr_str raises on a missing attribute
    return parse_json(text.encode("utf-8"), f"{where}: attribute {key!r} of {obj.name}")


# -- JSON ----------------------------------------------------------------------------------------


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, iteratively (stops counting past ``limit``)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(raw: bytes, where: str, *, max_depth: int | None = None) -> Any:
    """UTF-8 JSON with size and depth limits; any problem is a one-line ``RecordingError``."""
    if len(raw) > LIMITS["json_bytes"]:
        raise _BAD(f"{where}: {len(raw)} bytes of JSON (at most {LIMITS['json_bytes']})")
    depth = LIMITS["json_depth"] if max_depth is None else max_depth
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _BAD(f"{where}: not UTF-8 (byte {e.start})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise _BAD(f"{where}: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and integers too long to convert
        raise _BAD(f"{where}: not valid JSON ({first_line(e)})") from None
    if depth and json_depth(value, depth) > depth:  # 0: the caller bounds the depth itself
        raise _BAD(f"{where}: JSON nested deeper than {depth} levels")
    return value


def read_json_blob(
    f: h5py.File, name: str, where: str, checked: set[str] | None = None, **kw: Any
) -> Any:
    """A 1-D uint8 dataset of UTF-8 JSON (the format's way to hold text), with the limits."""
    ds = dataset(
        f, name, where, dtype="|u1", ndim=1, max_bytes=LIMITS["json_bytes"], checked=checked
    )
    if f.mode == "r" and getattr(f, "swmr_mode", False):
        ds.refresh()
    try:
        raw = ds[()].tobytes()
    except H5_ERRORS as e:
        raise _fail(where, f"/{name} cannot be read ({first_line(e)})") from None
    return parse_json(raw, f"{where}: /{name}", **kw)


# -- rings ----------------------------------------------------------------------------------------


def check_markers(markers: np.ndarray, where: str, name: str, *, modulo: bool) -> None:
    """Ring markers: ``-1`` (empty) or a step in ``[0, MAX_STEP]``; with ``modulo``, the step of
    slot ``i`` is ``i`` modulo the number of slots (the format's placement rule)."""
    bad = (markers < -1) | (markers > MAX_STEP)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(where, f"/{name}[{i}] = {int(markers[i])}, not a step (-1..2^53)")
    if modulo and markers.size:
        used = markers >= 0
        wrong = used & (markers % markers.size != np.arange(markers.size))
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            raise _fail(
                where,
                f"/{name}[{i}] holds step {int(markers[i])}, which belongs in slot "
                f"{int(markers[i]) % markers.size} of {markers.size}",
            )


def bytes_stored(arena: h5py.Dataset, path: str, name: str) -> int:
    """The most bytes a payload of ``arena`` can hold: what the arena stores, at most the
    file's size (see :func:`check_payload_stored`)."""
    try:
        return min(int(arena.id.get_storage_size()), os.path.getsize(path))
    except H5_ERRORS as e:
        raise _fail(path, f"/{name}: storage unreadable ({first_line(e)})") from None


def check_payload_stored(arena: h5py.Dataset, n: int, path: str, name: str) -> None:
    """A payload of ``n`` bytes is no larger than what the arena stores, nor than the file.

    A chunk the writer never wrote reads as fill values, so without this a small file could make
    the reader allocate whatever its ``nbytes`` claims. (Per-chunk presence would be sharper,
    but h5py 3.16 with HDF5 2.0 reports the chunk coordinates of a ``(1, chunk)``-chunked 2-D
    dataset as if it were 1-D, so only the total is relied on.)
    """
    stored = bytes_stored(arena, path, name)
    if n > stored:
        raise _fail(
            path, f"/{name}: a payload claims {n} bytes, more than the {stored} bytes stored"
        )


# -- record manifests -------------------------------------------------------------------------------

_TREE_TAGS = {
    "none",
    "bool",
    "str",
    "int",
    "float",
    "complex",
    "bytes",
    "ndarray",
    "npscalar",
    "tensor",
    "list",
    "tuple",
    "dict",
    "odict",
    "ntuple",
    "opaque",
    "object",
}
_DTYPE_KINDS = set("biufcmMSUV")
# What decodes to a hashable value, so may be a dict key (tuples: when their items are).
_HASHABLE = _TREE_TAGS - {"ndarray", "tensor", "list", "dict", "odict", "opaque", "object"}


def is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


#: A tensor's strides may ask for at most this many times its elements of memory (a slice of
#: every 64th column; more is no batch's layout, and a file's word to allocate it is not taken).
STRIDE_SPAN = 64


def _usable_strides(strides: Any, shape: list[int]) -> bool:
    """A tensor leaf's ``strides`` (v4, MAY): one non-negative int per dimension, spanning at
    most ``STRIDE_SPAN`` times the tensor's elements."""
    if strides == []:
        return True  # (absent: contiguous)
    if not (
        isinstance(strides, list)
        and len(strides) == len(shape)
        and all(is_int(x) and 0 <= x < 2**62 for x in strides)
    ):
        return False
    span: int = 1 + sum((n - 1) * x for n, x in zip(shape, strides) if n > 0)
    return span <= STRIDE_SPAN * max(math.prod(shape), 1)


def check_tree(root: Any, arena_bytes: int, where: str) -> None:
    """Every node of a record manifest (docs/format.md, "Record trees") is well formed, within
    ``LIMITS["tree_depth"]``, and every array or bytes leaf lies inside the ``arena_bytes`` that
    follow the manifest, with a size that matches its dtype and shape. Iterative: a deep manifest
    cannot exhaust the stack here."""
    bad = functools.partial(_fail, where)
    stack = [(root, 1, False)]  # (node, depth, is a dict key or inside one)
    while stack:
        node, depth, as_key = stack.pop()
        if depth > LIMITS["tree_depth"]:
            raise bad(f"record nested deeper than {LIMITS['tree_depth']} levels")
        if not isinstance(node, dict):
            raise bad(f"a record node is a {type(node).__name__}, not an object")
        t = node.get("t")
        if t not in _TREE_TAGS:
            raise bad(f"unknown record node type {str(t)[:40]!r}")
        if as_key and t not in _HASHABLE:
            raise bad(f"a dict key is a {t}, which cannot be a key")
        v = node.get("v")
        if t in ("ndarray", "npscalar", "tensor", "bytes"):
            off, n = node.get("off"), node.get("n")
            if not (is_int(off) and is_int(n) and off >= 0 and n >= 0 and off + n <= arena_bytes):
                raise bad(f"a {t} leaf lies outside the record's {arena_bytes} bytes")
            if t != "bytes":
                dt = node.get("dtype")
                try:
                    dtype = np.dtype(dt) if isinstance(dt, str) and len(dt) <= 16 else None
                except (TypeError, ValueError):
                    dtype = None
                if (
                    dtype is None
                    or dtype.str != dt
                    or dtype.kind not in _DTYPE_KINDS
                    or dtype.fields is not None
                    or dtype.subdtype is not None
                    or dtype.itemsize == 0
                ):
                    raise bad(f"a {t} leaf has an unusable dtype {str(dt)[:40]!r}")
                shape = node.get("shape")
                if (
                    not isinstance(shape, list)
                    or len(shape) > LIMITS["tree_ndim"]
                    or not all(is_int(s) and s >= 0 for s in shape)
                ):
                    raise bad(f"a {t} leaf has an unusable shape")
                if math.prod(shape) * dtype.itemsize != n:
                    raise bad(f"a {t} leaf of shape {shape} and dtype {dt} does not hold {n} bytes")
                if t == "npscalar" and shape:
                    raise bad("a numpy scalar leaf has a shape")
                if t == "tensor" and not (
                    isinstance(node.get("tdtype"), str)
                    and isinstance(node.get("device"), str)
                    and isinstance(node.get("grad"), bool)
                ):
                    raise bad("a tensor leaf lacks its tdtype, device or grad")
                if t == "tensor" and not _usable_strides(node.get("strides", []), shape):
                    raise bad("a tensor leaf has unusable strides")
        elif t == "bool":
            if not isinstance(v, bool):
                raise bad("a bool node does not hold a boolean")
        elif t == "str":
            if not isinstance(v, str):
                raise bad("a str node does not hold a string")
        elif t == "int":
            if not (is_int(v) or (isinstance(v, str) and 0 < len(v) <= 4300 and _intlike(v))):
                raise bad("an int node does not hold an integer")
        elif t == "float":
            if not (isinstance(v, str) and _floatlike(v)):
                raise bad("a float node does not hold a hex float")
        elif t == "complex":
            if not (isinstance(v, list) and len(v) == 2 and all(_floatlike(x) for x in v)):
                raise bad("a complex node does not hold two hex floats")
        elif t in ("list", "tuple", "ntuple"):
            if not isinstance(v, list):
                raise bad(f"a {t} node does not hold a list")
            if t == "ntuple":
                fields = node.get("fields")
                if not (
                    isinstance(fields, list)
                    and len(fields) == len(v)
                    and all(isinstance(x, str) and x for x in fields)
                    and all(isinstance(node.get(k), str) for k in ("name", "module", "qualname"))
                ):
                    raise bad("a namedtuple node has unusable fields")
            stack.extend((x, depth + 1, as_key) for x in v)
        elif t in ("dict", "odict"):
            k = node.get("k")
            if not (isinstance(k, list) and isinstance(v, list) and len(k) == len(v)):
                raise bad(f"a {t} node's keys and values do not match")
            stack.extend((x, depth + 1, True) for x in k)  # keys: hashable nodes only
            stack.extend((x, depth + 1, False) for x in v)
        elif t == "opaque":
            if not isinstance(node.get("type"), str) or not isinstance(node.get("repr", ""), str):
                raise bad("an opaque node lacks its type")
        elif t == "object":
            k = node.get("k")
            if not (
                isinstance(k, list)
                and isinstance(v, list)
                and len(k) == len(v)
                and all(isinstance(x, str) and x.isidentifier() and x[:2] != "__" for x in k)
                and all(isinstance(node.get(a), str) for a in ("module", "qualname"))
            ):
                raise bad("an object node has unusable attributes")
            stack.extend((x, depth + 1, as_key) for x in v)


def _intlike(s: str) -> bool:
    body = s[1:] if s[:1] in "+-" else s
    return body.isdigit() and body.isascii()


def _floatlike(s: Any) -> bool:
    if not isinstance(s, str) or len(s) > 64:
        return False
    try:
        float.fromhex(s)
    except (ValueError, OverflowError):
        return False
    return True


# -- meta/run ---------------------------------------------------------------------------------------


def _opt(d: dict[str, Any], key: str, kinds: tuple[type, ...] | type, where: str) -> Any:
    v = d.get(key)
    if v is not None and not isinstance(v, kinds):
        raise _BAD(f"{where}.{key} is a {type(v).__name__}")
    return v


def _check_reach(reach: Any, w: str) -> None:
    """``meta/run.reach`` (v3): tiers as ``[every, span]`` counts, and counts."""
    if reach is None:
        return
    tiers = reach.get("tiers")
    if not (
        isinstance(tiers, list)
        and 0 < len(tiers) <= 64
        and all(
            isinstance(t, list) and len(t) == 2 and all(is_int(x) and 0 <= x <= MAX_STEP for x in t)
            for t in tiers
        )
        and all(tiers[i][0] >= 1 for i in range(len(tiers)))
    ):
        raise _BAD(f"{w}.tiers is not a list of [every, span] counts")
    for key in ("step_slots", "snapshot_slots", "reach"):
        v = reach.get(key)
        if not (is_int(v) and 0 <= v <= MAX_STEP):
            raise _BAD(f"{w}.{key} is {str(v)[:40]!r}, not a count")


def check_meta(meta: Any, where: str, *, slots: dict[str, int] | None = None) -> None:
    """``/meta/run`` holds what the readers use, of the types they use (docs/format.md).

    ``slots`` (``{"step_slots": n, "health_slots": m, "keep_snapshots": k}``, from the rings)
    must agree with ``config``.
    """
    w = f"{where}: /meta/run"
    if not isinstance(meta, dict):
        raise _BAD(f"{w} is not an object")
    for key in ("config", "entry", "env", "model", "build_kwargs", "program", "reach"):
        _opt(meta, key, dict, w)
    _check_reach(meta.get("reach"), f"{w}.reach")
    program = meta.get("program") or {}
    for key in ("kind", "path", "module", "sha256"):
        _opt(program, key, str, f"{w}.program")
    if program and program.get("kind") not in ("script", "module"):
        raise _BAD(f"{w}.program.kind is {str(program.get('kind'))[:40]!r}")
    _opt(meta, "not_replayable", str, w)
    config = meta.get("config") or {}
    for key, v in config.items():
        if v is not None and not isinstance(v, (int, float, bool, str)):
            raise _BAD(f"{w}.config.{key} is a {type(v).__name__}")
    for key in (
        "snapshot_every",
        "fingerprint_every",
        "keep_snapshots",
        "snapshot_slots",
        "reach",
        "keep_bytes",
        "start_step",
    ):
        v = config.get(key)
        if v is not None and not (is_int(v) and 0 <= v <= MAX_STEP):
            raise _BAD(f"{w}.config.{key} is {str(v)[:40]!r}, not a count")
    for key, have in (slots or {}).items():
        v = config.get(key)
        if v is not None and (not is_int(v) or v != have):
            raise _BAD(f"{w}.config.{key} is {v!r} but the file holds {have}")
    for role, e in (meta.get("entry") or {}).items():
        if not isinstance(e, dict):
            raise _BAD(f"{w}.entry.{role} is not an object")
        for key in ("module", "qualname", "path"):
            if not isinstance(e.get(key), str):
                raise _BAD(f"{w}.entry.{role}.{key} is not a string")
        _opt(e, "sha256", str, f"{w}.entry.{role}")
        _opt(e, "is_script", bool, f"{w}.entry.{role}")
    env = meta.get("env") or {}
    devices = env.get("devices")
    if devices is not None and not (
        isinstance(devices, list) and all(isinstance(d, str) for d in devices)
    ):
        raise _BAD(f"{w}.env.devices is not a list of strings")
    started = _opt(env, "started", (int, float), f"{w}.env")
    if started is not None and not (0 <= started < 1e11):
        raise _BAD(f"{w}.env.started is {started!r}, not a time")
    for key in ("num_threads", "num_interop_threads"):
        v = _opt(env, key, int, f"{w}.env")
        if v is not None and not 0 < v <= 1 << 16:
            raise _BAD(f"{w}.env.{key} is {v}")
    model = meta.get("model") or {}
    _opt(model, "param_bytes", int, f"{w}.model")
    params = _opt(model, "params", list, f"{w}.model")
    for p in params or []:
        if not (
            isinstance(p, list)
            and len(p) == 4
            and isinstance(p[0], str)
            and isinstance(p[1], list)
            and len(p[1]) <= LIMITS["tree_ndim"]
            and all(is_int(s) and 0 <= s < 1 << 48 for s in p[1])
            and isinstance(p[2], str)
            and isinstance(p[3], bool)
        ):
            raise _BAD(f"{w}.model.params holds {str(p)[:60]!r}, not [name, shape, dtype, bool]")
    modules = _opt(model, "modules", list, f"{w}.model")
    for m in modules or []:
        if not (isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m)):
            raise _BAD(f"{w}.model.modules holds {str(m)[:60]!r}, not [name, class]")
    for part in ("optimizer", "scheduler", "scaler"):
        _opt(_opt(meta, part, dict, w) or {}, "class", str, f"{w}.{part}")
    dist = _opt(meta, "distributed", dict, w)
    if dist is not None:
        size = dist.get("world_size")
        rank = dist.get("rank")
        if size is not None and not (is_int(size) and 1 <= size <= MAX_WORLD_SIZE):
            raise _BAD(f"{w}.distributed.world_size is {str(size)[:40]}, not 1..{MAX_WORLD_SIZE}")
        if not (is_int(rank) and 0 <= rank < (size if size is not None else MAX_WORLD_SIZE)):
            raise _BAD(f"{w}.distributed.rank is {str(rank)[:40]}, not a rank of the run")
        _opt(dist, "backend", str, f"{w}.distributed")
        _opt(dist, "local_rank", int, f"{w}.distributed")


def check_record(rec: object, ring: str, step: int, where: str) -> None:
    """A decoded ``/steps`` or ``/snapshots`` record has the keys and types docs/format.md gives
    (what every reader indexes into), and names the step its marker says."""
    w = f"{where}: /{ring} step {step}"
    if not isinstance(rec, dict):
        raise _BAD(f"{w} is not a record (a dict)")
    if rec.get("step") != step:
        raise _BAD(f"{w} holds the record of step {str(rec.get('step'))[:40]}")
    if ring == "steps":
        exc = rec.get("exception")
        if exc is not None and not (
            isinstance(exc, dict) and all(isinstance(v, (str, type(None))) for v in exc.values())
        ):
            raise _BAD(f"{w}: the exception is not an object of strings")
        if not isinstance(rec.get("rng", {}), dict):
            raise _BAD(f"{w}: rng is not a dict")
        hp = rec.get("hparams", [])
        if not (isinstance(hp, list) and all(isinstance(g, dict) for g in hp)):
            raise _BAD(f"{w}: hparams is not a list of dicts")
        others = rec.get("object_hparams", {})
        if not (
            isinstance(others, dict)
            and all(
                isinstance(g, list) and all(isinstance(x, dict) for x in g) for g in others.values()
            )
        ):
            raise _BAD(f"{w}: object_hparams is not a dict of lists of dicts")
        for key in ("modes", "trainable"):
            flags = rec.get(key)
            if flags is not None and not (isinstance(flags, np.ndarray) and flags.ndim == 1):
                raise _BAD(f"{w}: {key} is not a 1-D array")
        ref = rec.get("batch_ref")
        if ref is not None and not (
            isinstance(ref, dict)
            and isinstance(ref.get("indices"), np.ndarray)
            and ref["indices"].dtype.kind in "iu"
            and ref["indices"].ndim <= 1
            and isinstance(ref.get("batched"), bool)
            and isinstance(ref.get("sha256"), str)
            and len(ref["sha256"]) == 64
        ):
            raise _BAD(f"{w}: batch_ref is not {{indices, batched, sha256}}")
        fn = rec.get("step_fn")
        if fn is not None and not (
            isinstance(fn, dict)
            and isinstance(fn.get("qualname"), str)
            and isinstance(fn.get("over"), (str, type(None)))
            and isinstance(fn.get("since", 0), int)
            and isinstance(fn.get("remake", {}), dict)
        ):
            raise _BAD(f"{w}: step_fn is not {{qualname, over}}")
    else:
        for key in ("model", "optimizer", "scheduler", "scaler"):
            if rec.get(key) is not None and not isinstance(rec[key], dict):
                raise _BAD(f"{w}: {key} is not a state dict")


def check_sources(sources: Any, where: str) -> None:
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise _BAD(f"{where}: /meta/sources is not an object of source texts")

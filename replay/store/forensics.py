"""The forensics sidecar (``RUN.forensics.h5``): writer and reader, per ``docs/forensics.md``.

NB: no torch import here. The TUI opens sidecars with this module alone, and opening a sidecar
runs no code: only numbers, string tables and UTF-8 JSON.

Example::

    write_forensics("run.forensics.h5", run_id="abc", step=12, tables=result.to_tables())
    f = ForensicsReader.open("run.forensics.h5")
    f.verdict["op"], f.n_ops, f.ops_columns(0, 4096)["status"]
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, SupportsInt

import h5py
import numpy as np

from ..errors import RecordingError
from ..jsonsafe import json_safe
from . import validate as V
from .contracts import OpStatus, Phase
from .safefile import replace_whole

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "OPS_COLUMNS",
    "OPTIONAL_OPS_COLUMNS",
    "MODULE_COLUMNS",
    "PARAM_COLUMNS",
    "STATS_COLUMNS",
    "PHASES",
    "STATUSES",
    "NotAForensicsFile",
    "write_forensics",
    "decode_op",
    "ForensicsReader",
    "source_lines",
]

FORMAT = "replay-forensics"
FORMAT_VERSION = 1
CHUNK_ROWS = 4096

STATS_COLUMNS = ("min", "max", "mean", "std", "absmax", "nan", "posinf", "neginf", "zeros", "numel")
# Indexed by the uint8 columns /ops/phase and /ops/status: str enums, equal to their names.
PHASES: tuple[Phase, ...] = tuple(Phase)
STATUSES: tuple[OpStatus, ...] = tuple(OpStatus)

# name -> (dtype, trailing shape); the order is the order of ops_columns().
OPS_COLUMNS: dict[str, tuple[str, tuple[int, ...]]] = {
    "phase": ("uint8", ()),
    "name": ("int32", ()),
    "module": ("int32", ()),
    "source": ("int32", ()),
    "stack": ("int32", ()),
    "node": ("int32", ()),
    "status": ("uint8", ()),
    "inputs": ("int32", ()),
    "outputs": ("int32", ()),
    "stats": ("float64", (len(STATS_COLUMNS),)),
    "hist": ("float32", (16,)),
    "mem_bytes": ("int64", ()),
    "time_ns": ("int64", ()),
    "closure": ("int32", ()),
}
#: Columns a sidecar written before they existed lacks: read back as -1 (none).
OPTIONAL_OPS_COLUMNS = frozenset({"closure"})
MODULE_COLUMNS = {
    "name": "int32",
    "kind": "int32",
    "parent": "int32",
    "act_mean": "float64",
    "act_std": "float64",
    "act_absmax": "float64",
    "act_zero_frac": "float64",
    "act_nonfinite": "float64",
    "n_ops": "int32",
}
PARAM_COLUMNS = {
    "name": "int32",
    "numel": "int64",
    "requires_grad": "bool",
    "has_grad": "bool",
    "grad_norm": "float64",
    "grad_nan": "float64",
    "grad_inf": "float64",
    "weight_norm": "float64",
    "weight_mean": "float64",
    "weight_std": "float64",
    "update_norm": "float64",
    "update_ratio": "float64",
}
STRING_TABLES = (
    "ops",
    "modules",
    "locations",
    "stacks",
    "shapes",
    "module_kinds",
    "params",
    "nodes",
)


class NotAForensicsFile(RecordingError, ValueError):
    """The file is not a forensics sidecar this version of replay can read, or it is damaged
    (a ``RecordingError``: exit code 3; a ``ValueError`` for older callers)."""


def _group(parent: h5py.Group, name: str, encoding: str) -> h5py.Group:
    g = parent.create_group(name)
    g.attrs["encoding-type"], g.attrs["encoding-version"] = encoding, 1
    return g


def _blob(g: h5py.Group, name: str, value: Any) -> None:
    text = json.dumps(json_safe(value), allow_nan=False, separators=(",", ":"))
    g.create_dataset(name, data=np.frombuffer(text.encode("utf-8"), dtype=np.uint8))


def _columns(g: h5py.Group, spec: dict[str, Any], data: Any, where: str, chunked: bool) -> None:
    read = getattr(data, "read", None)
    if read is not None:  # an OpColumns (replay.trace.spool): written in row ranges
        n = int(data.rows)
        for name, (dtype, tail) in spec.items():
            ds = g.create_dataset(
                name,
                shape=(n, *tail),
                dtype=dtype,
                chunks=(min(CHUNK_ROWS, max(1, n)), *tail),
                maxshape=(None, *tail),
            )
            for a in range(0, n, 1 << 16):
                ds[a : min(n, a + (1 << 16))] = np.asarray(read(name, a, a + (1 << 16)), dtype)
        return
    given = [k for k in spec if k in data or k not in OPTIONAL_OPS_COLUMNS]
    lengths = {len(np.asarray(data[k])) for k in given}
    if len(lengths) > 1:
        raise ValueError(f"{where}: columns differ in length: {sorted(lengths)}")
    if len(given) < len(spec):  # an optional /ops column not given: -1 (none) in every row
        rows = lengths.pop() if lengths else 0
        data = {**data, **{k: np.full(rows, -1) for k in spec if k not in given}}
    for name, dt in spec.items():
        dtype, tail = dt if isinstance(dt, tuple) else (dt, ())
        arr = np.asarray(data[name], dtype=dtype).reshape((-1, *tail))
        chunks = (min(CHUNK_ROWS, max(1, len(arr))), *tail) if chunked else None
        g.create_dataset(name, data=arr, chunks=chunks, maxshape=(None, *tail) if chunked else None)


def write_forensics(
    path: str | os.PathLike[str], *, run_id: str, step: int, tables: dict[str, Any]
) -> None:
    """Write a sidecar atomically (``safefile.replace_whole``).

    ``tables`` is what ``TraceResult.to_tables()`` returns: keys ``verdict`` (dict[str, Any]), ``ops``,
    ``modules``, ``params`` (dicts of columns), ``strings`` (dict[str, Any] of lists of str), ``memory``
    (``peak_bytes``, ``peak_op``, ``largest``), ``sources`` and ``batch`` (JSON values).
    """
    path = os.fspath(path)
    missing = {"verdict", "ops", "strings", "modules", "params", "memory", "sources", "batch"}
    missing -= set(tables)
    if missing:
        raise ValueError(f"write_forensics: tables lack {sorted(missing)}")
    # Made in memory, then written in one go: HDF5 writing into a file on a full disk fails in
    # its metadata cache as objects are freed, where it cannot raise, and it crashed the process
    # (`replay bisect` segfaulted). The image is one buffer of the sidecar's size (~200 bytes an
    # op, 15 MiB for test_whole_step's 78,606 ops, where the trace's bound is 96 MiB).
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["run_id"] = str(run_id)
        f.attrs["step"] = int(step)
        f.attrs["created"] = time.time()
        _blob(_group(f, "verdict", "verdict"), "json", tables["verdict"])
        ops = _group(f, "ops", "op-table")
        ops.attrs["stats_columns"] = json.dumps(STATS_COLUMNS)
        _columns(ops, OPS_COLUMNS, tables["ops"], "/ops", chunked=True)
        strings = _group(f, "strings", "string-tables")
        for name in STRING_TABLES:
            _blob(strings, name, [str(s) for s in tables["strings"].get(name, [])])
        for name, kind, spec in (
            ("modules", "module-table", MODULE_COLUMNS),
            ("params", "param-table", PARAM_COLUMNS),
        ):
            _columns(_group(f, name, kind), spec, tables[name], f"/{name}", chunked=False)
        mem = _group(f, "memory", "memory")
        mem.attrs["peak_bytes"] = int(tables["memory"]["peak_bytes"])
        mem.attrs["peak_op"] = int(tables["memory"]["peak_op"])
        _blob(mem, "largest", tables["memory"]["largest"])
        _blob(_group(f, "sources", "sources"), "json", tables["sources"])
        _blob(_group(f, "batch", "batch"), "json", tables["batch"])
    with replace_whole(path, "the forensics sidecar") as raw:
        raw.write(image.getbuffer())


def decode_op(
    i: int, row: Mapping[str, Any], strings: Callable[[str], Sequence[str]]
) -> dict[str, Any]:
    """Op ``i`` (``row``: one value per ``/ops`` column) with its string indices decoded through
    ``strings(table)``: what ``ForensicsReader.op_row`` and ``TraceResult.op_row`` both return
    (the reader adds the op's ``stack`` and ``hist``)."""

    def s(table: str, idx: SupportsInt) -> str | None:
        k = int(idx)
        return strings(table)[k] if k >= 0 else None

    return {
        "index": i,
        "phase": PHASES[int(row["phase"])],
        "op": s("ops", row["name"]),
        "module": s("modules", row["module"]),
        "source": s("locations", row["source"]),
        "node": s("nodes", row["node"]),
        "status": STATUSES[int(row["status"])],
        "inputs": s("shapes", row["inputs"]),
        "outputs": s("shapes", row["outputs"]),
        "stats": {k: float(v) for k, v in zip(STATS_COLUMNS, row["stats"])},
        "mem_bytes": int(row["mem_bytes"]),
        "time_ns": int(row["time_ns"]),
        "closure": int(row["closure"]),
    }


def _index(x: Any) -> bool:
    return V.is_int(x) and x >= 0


class ForensicsReader:
    """Read-only view of a sidecar. Row ranges of ``/ops`` are read on demand, so a TUI can page
    through hundreds of thousands of ops without loading them all.

    A sidecar is untrusted input like a recording (``validate.py``): ``open`` checks every
    dataset's dtype and shape, the tables' lengths against each other, every string index and
    the JSON blobs before anything is shown; a violation is :class:`NotAForensicsFile`.

    Example::

        with ForensicsReader.open("run.forensics.h5") as f:
            cols = f.ops_columns(0, 100)      # dict[str, Any] of numpy arrays
            f.op_row(f.verdict["op_index"])   # one op, strings decoded
    """

    def __init__(self, file: h5py.File, path: str) -> None:
        self._f = file
        self.path = path
        self._strings: dict[str, list[str]] = {}
        self._stacks: list[list[int]] = []
        self._absent: set[str] = set()  # optional /ops columns an older sidecar lacks

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ForensicsReader:
        path = os.fspath(path)
        try:
            V.check_regular_file(path, "forensics sidecar")
        except RecordingError as e:
            raise NotAForensicsFile(str(e)) from None
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise NotAForensicsFile(
                f"{path} is not an HDF5 file ({str(e).splitlines()[0]}); a forensics sidecar is "
                "written by `replay bisect` or `replay trace` as RUN.forensics.h5"
            ) from None
        opened = False
        try:
            fmt = V.attr_str(f, "format", path, required=False)
            if fmt != FORMAT:
                raise NotAForensicsFile(
                    f"{path} does not look like a forensics sidecar (format={fmt!r}); "
                    "open RUN.forensics.h5, written by `replay bisect` or `replay trace`"
                )
            version = V.attr_int(f, "format_version", path, lo=-(2**62), hi=2**62)
            if version != FORMAT_VERSION:
                raise NotAForensicsFile(
                    f"{path} is forensics format version {version}; this replay reads version "
                    f"{FORMAT_VERSION}: re-run `replay bisect` to regenerate it"
                )
            reader = cls(f, path)
            reader._validate()
            opened = True
        except NotAForensicsFile:
            raise
        except RecordingError as e:
            raise NotAForensicsFile(str(e)) from None
        except V.H5_ERRORS as e:  # the HDF5 library failed on damaged metadata
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise NotAForensicsFile(f"{path}: damaged forensics sidecar ({why})") from None
        finally:
            if not opened:  # whatever failed, the file is not left open
                f.close()
        return reader

    # -- validation ---------------------------------------------------------------------------

    def _bad(self, what: str) -> NotAForensicsFile:
        return NotAForensicsFile(f"{self.path}: damaged forensics sidecar: {what}")

    def _columns(
        self,
        group: str,
        spec: dict[str, Any],
        max_rows: int,
        optional: frozenset[str] = frozenset(),
    ) -> int:
        n = None
        for name, dt in spec.items():
            if name in optional and f"{group}/{name}" not in self._f:
                self._absent.add(name)
                continue
            dtype, tail = dt if isinstance(dt, tuple) else (dt, ())
            ds = V.dataset(
                self._f,
                f"{group}/{name}",
                self.path,
                dtype=np.dtype(dtype).str,
                ndim=1 + len(tail),
                shape=(n, *tail),
                max_rows=max_rows,
            )
            n = ds.shape[0]
        return int(n or 0)

    def _index_range(self, name: str, lo: int, hi: int, rows: Any = ()) -> None:
        """The indices in ``rows`` of column ``name`` lie in ``lo..hi - 1``."""
        column = self._f[name][rows]
        if column.size and (int(column.min()) < lo or int(column.max()) >= hi):
            raise self._bad(
                f"/{name} holds {int(column.min())}..{int(column.max())}, not {lo}..{hi - 1}"
            )

    def _json_blob(self, name: str, path: str) -> Any:
        """A JSON blob, within what is left of the sidecar's JSON budget (all read at open)."""
        ds = V.dataset(self._f, name, path, dtype="|u1", ndim=1, max_bytes=V.LIMITS["json_bytes"])
        self._json_total += ds.shape[0]
        if self._json_total > V.LIMITS["sidecar_json_bytes"]:
            raise self._bad(f"more than {V.LIMITS['sidecar_json_bytes']} bytes of JSON")
        return V.read_json_blob(self._f, name, path)

    def _validate(self) -> None:
        f, path = self._f, self.path
        self._json_total = 0
        self.run_id = V.attr_str(f, "run_id", path) or ""
        self.step = V.attr_int(f, "step", path, lo=0, hi=V.MAX_STEP)
        for name in STRING_TABLES:
            table = self._json_blob(f"strings/{name}", path)
            if not isinstance(table, list) or not all(isinstance(x, str) for x in table):
                raise self._bad(f"/strings/{name} is not a list of strings")
            self._strings[name] = table
        n_loc = len(self._strings["locations"])
        for i, text in enumerate(self._strings["stacks"]):
            stack = V.parse_json(text.encode("utf-8"), f"{path}: /strings/stacks[{i}]")
            if not isinstance(stack, list) or not all(
                V.is_int(j) and 0 <= j < n_loc for j in stack
            ):
                raise self._bad(f"/strings/stacks[{i}] is not a list of location indices")
            self._stacks.append(stack)
        stats_columns = V.attr_json(V.resolve(f, "ops", path), "stats_columns", path)
        if stats_columns != list(STATS_COLUMNS):
            raise self._bad("/ops stats_columns is not the list of statistics")
        self.n_ops = n_ops = self._columns(
            "ops", OPS_COLUMNS, V.LIMITS["ops_rows"], OPTIONAL_OPS_COLUMNS
        )
        refs = {
            "name": "ops",
            "module": "modules",
            "source": "locations",
            "stack": "stacks",
            "node": "nodes",
            "inputs": "shapes",
            "outputs": "shapes",
        }
        bounds = {col: (-1, len(self._strings[table])) for col, table in refs.items()}
        bounds.update(phase=(0, len(PHASES)), status=(0, len(STATUSES)))
        if "closure" not in self._absent:
            bounds["closure"] = (-1, 1 << 30)
        step = 1 << 20  # rows at a time: the check's memory stays small for any table
        for a in range(0, n_ops, step):
            for col, (lo, hi) in bounds.items():
                self._index_range(f"ops/{col}", lo, hi, np.s_[a : a + step])
        n_mod = self._columns("modules", MODULE_COLUMNS, V.LIMITS["table_rows"])
        self._index_range("modules/name", -1, len(self._strings["modules"]))
        self._index_range("modules/kind", -1, len(self._strings["module_kinds"]))
        self._index_range("modules/parent", -1, n_mod)
        self._columns("params", PARAM_COLUMNS, V.LIMITS["table_rows"])
        self._index_range("params/name", -1, len(self._strings["params"]))
        mem = V.resolve(f, "memory", path)
        self._peak_bytes = V.attr_int(mem, "peak_bytes", path, lo=-1, hi=2**62)
        self._peak_op = V.attr_int(mem, "peak_op", path, lo=-1, hi=max(n_ops - 1, -1))
        largest = self._json_blob("memory/largest", path)
        if not isinstance(largest, list) or not all(
            isinstance(x, dict)
            and V.is_int(x.get("bytes"))
            and V.is_int(x.get("op_index"))
            and -1 <= x["op_index"] < n_ops
            and isinstance(x.get("shape"), list)
            and all(V.is_int(d) for d in x["shape"])
            and isinstance(x.get("dtype"), str)
            and isinstance(x.get("op"), (str, type(None)))
            for x in largest
        ):
            raise self._bad("/memory/largest is not a list of {bytes, shape, dtype, op_index, op}")
        self._largest: list[dict[str, Any]] = largest
        self.verdict: dict[str, Any] = self._check_verdict(self._json_blob("verdict/json", path))
        sources = self._json_blob("sources/json", path)
        if not isinstance(sources, dict) or not all(
            isinstance(e, dict)
            and isinstance(e.get("lines", {}), dict)
            and all(
                isinstance(k, str) and k.isascii() and k.isdigit() and isinstance(v, str)
                for k, v in e.get("lines", {}).items()
            )
            for e in sources.values()
        ):
            raise self._bad("/sources/json is not {path: {'lines': {number: text}}}")
        self._sources: dict[str, Any] = sources
        batch = self._json_blob("batch/json", path)
        if not isinstance(batch, dict) or not isinstance(batch.get("leaves", []), list):
            raise self._bad("/batch/json is not an object with a list of leaves")
        self._batch: dict[str, Any] = batch

    def _check_verdict(self, v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self._bad("/verdict/json is not an object")
        idx = v.get("op_index")
        if idx is not None and not (V.is_int(idx) and 0 <= idx < self.n_ops):
            raise self._bad(f"the verdict's op_index {str(idx)[:20]} is not a row of /ops")
        step = v.get("step")
        if step is not None and not (V.is_int(step) and 0 <= step <= V.MAX_STEP):
            raise self._bad("the verdict's step is not a step")
        samples, axes = v.get("samples"), v.get("sample_axes")
        if axes is not None and not (
            isinstance(axes, list) and len(axes) in (1, 2) and all(map(_index, axes))
        ):
            raise self._bad("the verdict's sample_axes are not one or two batch axes")
        pairs = axes is not None and len(axes) == 2  # [micro-batch, row]
        if samples is not None and not (
            isinstance(samples, list)
            and all(
                isinstance(s, list) and len(s) == 2 and all(map(_index, s)) if pairs else _index(s)
                for s in samples
            )
        ):
            raise self._bad("the verdict's samples are not sample indices")
        if v.get("sample_layout") not in (None, "rows", "items", "zipped", "micro"):
            raise self._bad("the verdict's sample_layout is not one of rows, items, zipped, micro")
        for key in ("kind", "op", "phase", "module", "autograd_node"):
            if v.get(key) is not None and not isinstance(v[key], str):
                raise self._bad(f"the verdict's {key} is not a string")
        for key in ("source", "created_at", "executed_at", "exception", "output"):
            if v.get(key) is not None and not isinstance(v[key], dict):
                raise self._bad(f"the verdict's {key} is not an object")
        for key in ("propagators", "previous", "inputs"):
            if v.get(key) is not None and not (
                isinstance(v[key], list) and all(isinstance(x, dict) for x in v[key])
            ):
                raise self._bad(f"the verdict's {key} is not a list of objects")
        for key in ("sinks", "notes"):
            if v.get(key) is not None and not (
                isinstance(v[key], list) and all(isinstance(x, str) for x in v[key])
            ):
                raise self._bad(f"the verdict's {key} is not a list of strings")
        return v

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ForensicsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def strings(self, name: str) -> list[str]:
        return self._strings[name]

    def ops_columns(
        self, start: int, stop: int, columns: tuple[str, ...] | None = None
    ) -> dict[str, Any]:
        """Rows ``[start, stop)`` of every (or the named) op column, as numpy arrays."""
        start, stop = max(0, int(start)), min(self.n_ops, int(stop))
        stop = max(start, stop)
        names = columns if columns is not None else tuple(OPS_COLUMNS)
        try:
            return {
                n: np.full(stop - start, -1, dtype=OPS_COLUMNS[n][0])
                if n in self._absent
                else self._f[f"ops/{n}"][start:stop]
                for n in names
            }
        except V.H5_ERRORS as e:
            raise self._bad(f"/ops rows {start}..{stop} cannot be read ({e})") from None

    def op_row(self, i: int) -> dict[str, Any]:
        """One op with its strings decoded (``stack`` as a list of locations, innermost last)."""
        if not 0 <= i < self.n_ops:
            raise IndexError(f"op {i} out of range (the table has {self.n_ops} ops)")
        row = {k: v[0] for k, v in self.ops_columns(i, i + 1).items()}
        op = decode_op(i, row, self.strings)  # every index was checked against its table in open()
        locations = self.strings("locations")
        stack_idx = int(row["stack"])
        op["stack"] = [locations[j] for j in self._stacks[stack_idx]] if stack_idx >= 0 else []
        op["hist"] = row["hist"].astype(float).tolist()
        return op

    def _table(
        self, group: str, spec: dict[str, Any], string_cols: dict[str, str]
    ) -> list[dict[str, Any]]:
        g = self._f[group]
        cols = {k: g[k][()] for k in spec}  # lengths and indices checked in open()
        out = []
        for i in range(len(cols["name"])):
            row: dict[str, Any] = {k: cols[k][i].item() for k in spec}
            for k, table in string_cols.items():
                row[k] = self.strings(table)[row[k]] if row[k] >= 0 else None
            out.append(row)
        return out

    def modules(self) -> list[dict[str, Any]]:
        """One dict[str, Any] per module: name, kind, parent (row), activation statistics, n_ops."""
        return self._table("modules", MODULE_COLUMNS, {"name": "modules", "kind": "module_kinds"})

    def params(self) -> list[dict[str, Any]]:
        """One dict[str, Any] per named parameter: grad, weight and update statistics."""
        return self._table("params", PARAM_COLUMNS, {"name": "params"})

    def memory(self) -> dict[str, Any]:
        return {
            "peak_bytes": self._peak_bytes,
            "peak_op": self._peak_op,
            "largest": self._largest,
        }  # the curve itself: ops_columns(a, b, ("mem_bytes",))

    def sources(self) -> dict[str, Any]:
        return self._sources

    def batch(self) -> dict[str, Any]:
        return self._batch


def source_lines(kept: dict[str, Any], recorded: Mapping[str, str]) -> dict[str, dict[int, str]]:
    """``{path: {line: text}}`` as the source views show code: a sidecar's kept lines
    (``ForensicsReader.sources()``), else the recorded entry-point files (``Recording.sources``)."""
    out = {path: {int(k): v for k, v in e.get("lines", {}).items()} for path, e in kept.items()}
    for path, text in recorded.items():
        out.setdefault(path, {}).update({i + 1: s for i, s in enumerate(text.splitlines())})
    return out

"""The forensics sidecar (``RUN.forensics.h5``): writer and reader, per ``docs/forensics.md``.

NB: no torch import here. The TUI opens sidecars with this module alone, and opening a sidecar
runs no code: only numbers, string tables and UTF-8 JSON.

Example::

    write_forensics("run.forensics.h5", run_id="abc", step=12, tables=result.to_tables())
    f = ForensicsReader.open("run.forensics.h5")
    f.verdict["op"], f.n_ops, f.ops_columns(0, 4096)["status"]
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import h5py
import numpy as np

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "OPS_COLUMNS",
    "STATS_COLUMNS",
    "PHASES",
    "STATUSES",
    "NotAForensicsFile",
    "write_forensics",
    "ForensicsReader",
    "json_safe",
]

FORMAT = "replay-forensics"
FORMAT_VERSION = 1
CHUNK_ROWS = 4096

STATS_COLUMNS = ("min", "max", "mean", "std", "absmax", "nan", "posinf", "neginf", "zeros", "numel")
PHASES = ("forward", "backward", "optimizer", "other")
STATUSES = ("finite", "producer", "propagator", "raised", "exempt")

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
}
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
STRING_TABLES = ("ops", "modules", "locations", "stacks", "shapes", "module_kinds", "params", "nodes")


class NotAForensicsFile(ValueError):
    """The file is not a forensics sidecar this version of replay can read."""


def json_safe(value: Any) -> Any:
    """Non-finite floats become the strings "nan", "inf", "-inf" (JSON has no such numbers)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value


def _json_bytes(value: Any) -> np.ndarray:
    text = json.dumps(json_safe(value), allow_nan=False, separators=(",", ":"))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def _json_load(ds: h5py.Dataset) -> Any:
    return json.loads(ds[()].tobytes().decode("utf-8"))


def _group(parent: h5py.Group, name: str, encoding: str) -> h5py.Group:
    g = parent.create_group(name)
    g.attrs["encoding-type"] = encoding
    g.attrs["encoding-version"] = 1
    return g


def _blob(g: h5py.Group, name: str, value: Any) -> None:
    g.create_dataset(name, data=_json_bytes(value))


def _columns(g: h5py.Group, spec: dict, data: dict, where: str, chunked: bool) -> None:
    lengths = {len(np.asarray(data[k])) for k in spec}
    if len(lengths) > 1:
        raise ValueError(f"{where}: columns differ in length: {sorted(lengths)}")
    for name, dt in spec.items():
        dtype, tail = dt if isinstance(dt, tuple) else (dt, ())
        arr = np.asarray(data[name], dtype=dtype).reshape((-1, *tail))
        chunks = (min(CHUNK_ROWS, max(1, len(arr))), *tail) if chunked else None
        g.create_dataset(name, data=arr, chunks=chunks, maxshape=(None, *tail) if chunked else None)


def write_forensics(path: str | os.PathLike, *, run_id: str, step: int, tables: dict) -> None:
    """Write a sidecar atomically (``path + ".tmp"``, then ``os.replace``).

    ``tables`` is what ``TraceResult.to_tables()`` returns: keys ``verdict`` (dict), ``ops``,
    ``modules``, ``params`` (dicts of columns), ``strings`` (dict of lists of str), ``memory``
    (``peak_bytes``, ``peak_op``, ``largest``), ``sources`` and ``batch`` (JSON values).
    """
    path = os.fspath(path)
    missing = {"verdict", "ops", "strings", "modules", "params", "memory", "sources", "batch"}
    missing -= set(tables)
    if missing:
        raise ValueError(f"write_forensics: tables lack {sorted(missing)}")
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
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
        _columns(_group(f, "modules", "module-table"), MODULE_COLUMNS, tables["modules"],
                 "/modules", chunked=False)
        _columns(_group(f, "params", "param-table"), PARAM_COLUMNS, tables["params"],
                 "/params", chunked=False)
        mem = _group(f, "memory", "memory")
        mem.attrs["peak_bytes"] = int(tables["memory"]["peak_bytes"])
        mem.attrs["peak_op"] = int(tables["memory"]["peak_op"])
        _blob(mem, "largest", tables["memory"]["largest"])
        _blob(_group(f, "sources", "sources"), "json", tables["sources"])
        _blob(_group(f, "batch", "batch"), "json", tables["batch"])
    os.replace(tmp, path)


class ForensicsReader:
    """Read-only view of a sidecar. Row ranges of ``/ops`` are read on demand, so a TUI can page
    through hundreds of thousands of ops without loading them all.

    Example::

        with ForensicsReader.open("run.forensics.h5") as f:
            cols = f.ops_columns(0, 100)      # dict of numpy arrays
            f.op_row(f.verdict["op_index"])   # one op, strings decoded
    """

    def __init__(self, file: h5py.File, path: str) -> None:
        self._f = file
        self.path = path
        self._strings: dict[str, list[str]] = {}

    @classmethod
    def open(cls, path: str | os.PathLike) -> ForensicsReader:
        path = os.fspath(path)
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise NotAForensicsFile(
                f"{path} is not an HDF5 file ({e}); a forensics sidecar is written by "
                "`replay bisect` or `replay trace` as RUN.forensics.h5"
            ) from None
        fmt = f.attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        if fmt != FORMAT:
            f.close()
            raise NotAForensicsFile(
                f"{path} does not look like a forensics sidecar (format={fmt!r}); "
                "open RUN.forensics.h5, written by `replay bisect` or `replay trace`"
            )
        version = int(f.attrs.get("format_version", -1))
        if version != FORMAT_VERSION:
            f.close()
            raise NotAForensicsFile(
                f"{path} is forensics format version {version}; this replay reads version "
                f"{FORMAT_VERSION}: re-run `replay bisect` to regenerate it"
            )
        return cls(f, path)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ForensicsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def run_id(self) -> str:
        v = self._f.attrs["run_id"]
        return v.decode() if isinstance(v, bytes) else str(v)

    @property
    def step(self) -> int:
        return int(self._f.attrs["step"])

    @property
    def verdict(self) -> dict:
        return _json_load(self._f["verdict/json"])

    @property
    def n_ops(self) -> int:
        return int(self._f["ops/phase"].shape[0])

    @property
    def stats_columns(self) -> list[str]:
        return list(json.loads(self._f["ops"].attrs["stats_columns"]))

    def strings(self, name: str) -> list[str]:
        if name not in self._strings:
            self._strings[name] = _json_load(self._f[f"strings/{name}"])
        return self._strings[name]

    def ops_columns(self, start: int, stop: int, columns: tuple[str, ...] | None = None) -> dict:
        """Rows ``[start, stop)`` of every (or the named) op column, as numpy arrays."""
        start, stop = max(0, int(start)), min(self.n_ops, int(stop))
        stop = max(start, stop)
        names = columns if columns is not None else tuple(OPS_COLUMNS)
        return {n: self._f[f"ops/{n}"][start:stop] for n in names}

    def op_row(self, i: int) -> dict:
        """One op with its strings decoded (``stack`` as a list of locations, innermost last)."""
        if not 0 <= i < self.n_ops:
            raise IndexError(f"op {i} out of range (the table has {self.n_ops} ops)")
        c = self.ops_columns(i, i + 1)
        row = {k: v[0] for k, v in c.items()}

        def s(table: str, idx: Any) -> str | None:
            idx = int(idx)
            return self.strings(table)[idx] if idx >= 0 else None

        stack_text = s("stacks", row["stack"])
        locations = self.strings("locations")
        stack = [locations[j] for j in json.loads(stack_text)] if stack_text else []
        return {
            "index": i,
            "phase": PHASES[int(row["phase"])],
            "op": s("ops", row["name"]),
            "module": s("modules", row["module"]),
            "source": s("locations", row["source"]),
            "stack": stack,
            "node": s("nodes", row["node"]),
            "status": STATUSES[int(row["status"])],
            "inputs": s("shapes", row["inputs"]),
            "outputs": s("shapes", row["outputs"]),
            "stats": {k: float(v) for k, v in zip(STATS_COLUMNS, row["stats"])},
            "hist": row["hist"].astype(float).tolist(),
            "mem_bytes": int(row["mem_bytes"]),
            "time_ns": int(row["time_ns"]),
        }

    def _table(self, group: str, spec: dict, string_cols: dict[str, str]) -> list[dict]:
        g = self._f[group]
        cols = {k: g[k][()] for k in spec}
        n = len(cols["name"])
        out = []
        for i in range(n):
            row: dict[str, Any] = {}
            for k in spec:
                v = cols[k][i].item()
                if k in string_cols:
                    v = self.strings(string_cols[k])[v] if v >= 0 else None
                row[k] = v
            out.append(row)
        return out

    def modules(self) -> list[dict]:
        """One dict per module: name, kind, parent (row), activation statistics, n_ops."""
        return self._table("modules", MODULE_COLUMNS, {"name": "modules", "kind": "module_kinds"})

    def params(self) -> list[dict]:
        """One dict per named parameter: grad, weight and update statistics."""
        return self._table("params", PARAM_COLUMNS, {"name": "params"})

    def memory(self) -> dict:
        g = self._f["memory"]
        return {
            "peak_bytes": int(g.attrs["peak_bytes"]),
            "peak_op": int(g.attrs["peak_op"]),
            "largest": _json_load(g["largest"]),
        }  # the curve itself: ops_columns(a, b, ("mem_bytes",))

    def sources(self) -> dict:
        return _json_load(self._f["sources/json"])

    def batch(self) -> dict:
        return _json_load(self._f["batch/json"])

"""A corpus of crafted recordings and sidecars: what a stranger could hand a replay user.

Every case starts from a *real* small recording (made once a session by a real training loop,
``conftest.py``) or a sidecar written by the real ``write_forensics``, and changes one thing with
h5py, the way an attacker would. Each :class:`Case` says what ``replay info`` and ``replay doctor``
must exit with, whether the TUI must refuse it or open it, and a fragment its error line must hold
(the dataset it names).

Files an attack would make the reader open outside the recording (external links, external raw
storage, virtual datasets) point at *FIFO canaries*: opening one for reading blocks until a writer
comes, so a reader that follows the link hangs and the test's timeout catches it. A FIFO is also
the cheapest way to see that nothing else is opened behind the reader's back.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from replay.errors import EXIT_INCOMPLETE_RANKS
from replay.store.checksum import health_crc, slot_crc
from replay.store.forensics import write_forensics
from replay.store.writer import pack_parts

# What an attacker puts in strings: an OSC title change, a screen clear, an 8-bit CSI, OSC 52
# (clipboard write), a bidi override, a fake report line, Rich markup, a lone surrogate.
EVIL = (
    "x\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil\x1b]52;c;ZXZpbA==\x07"
    "\n  status          closed cleanly [bold][/bold][link=file:///etc/passwd]l[/link]\ud800"
)

OK, BAD = 0, 3  # exit codes: success, unusable recording (README)
INCOMPLETE = EXIT_INCOMPLETE_RANKS  # a rank set with a missing or damaged rank file


@dataclass
class Case:
    name: str
    path: str  # what the commands are given
    info: int = BAD  # expected exit code of `replay info`
    doctor: int = BAD  # ... of `replay doctor`
    # "refused": make_app raises RecordingError; "opens": every view shows without an error;
    # "fails": it opens, and browsing back to the first batch ends the app with a RecordingError;
    # "either": refused, or opens (and may fail with a RecordingError while browsing)
    tui: str = "refused"
    fragment: str = ""  # in the error line of info (or doctor, when info succeeds)
    replay: bool = False  # also run `replay verify` and `replay bisect`: exit 3 as well
    notes: dict[str, Any] = field(default_factory=dict)


# -- helpers ---------------------------------------------------------------------------------------


def _copy(base: Path, out: Path, name: str) -> Path:
    d = out / name
    d.mkdir()
    p = d / "run.h5"
    shutil.copy(base, p)
    return p


def _blob(f: h5py.File, name: str, raw: bytes) -> None:
    del f[name]
    f.create_dataset(name, data=np.frombuffer(raw, dtype=np.uint8))


def _meta(f: h5py.File) -> dict:
    return json.loads(f["meta/run"][()].tobytes())


def _first_slot(f: h5py.File, ring: str) -> int:
    m = f[f"{ring}/step"][()]
    used = np.flatnonzero(m >= 0)
    return int(used[np.argmin(m[used])])


def _put_payload(f: h5py.File, ring: str, slot: int, manifest_raw: bytes, arena: bytes) -> None:
    payload = np.frombuffer(manifest_raw + arena, dtype=np.uint8)
    ds = f[f"{ring}/arena"]
    if payload.size > ds.shape[1]:
        ds.resize((ds.shape[0], payload.size))
    ds[slot, : payload.size] = payload
    f[f"{ring}/nbytes"][slot] = payload.size
    f[f"{ring}/mlen"][slot] = len(manifest_raw)
    if "crc" in f[ring]:  # a stranger with h5py recomputes the checksum: CRC is no seal
        f[f"{ring}/crc"][slot] = slot_crc(int(f[f"{ring}/step"][slot]), payload)


def _put_record(f: h5py.File, ring: str, slot: int, tree: Any) -> None:
    parts, mlen = pack_parts(tree)
    raw = np.concatenate(parts).tobytes()
    _put_payload(f, ring, slot, raw[:mlen], raw[mlen:])


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)


# -- the recording cases -----------------------------------------------------------------------------


def recording_cases(base: Path, out: Path) -> list[Case]:  # noqa: PLR0915 - one block per case
    """Every crafted recording, written under ``out`` (fresh, empty)."""
    cases: list[Case] = []

    def case(name: str, **kw: Any) -> tuple[Path, Case]:
        p = _copy(base, out, name)
        c = Case(name, str(p), **kw)
        cases.append(c)
        return p, c

    # Strings with terminal escapes everywhere a reader shows them: must open, and print safely.
    p, _ = case("escapes_in_meta", info=OK, doctor=OK, tui="opens")
    with h5py.File(p, "r+") as f:
        meta = _meta(f)
        for e in meta["entry"].values():
            e["qualname"] = "train" + EVIL
            e["module"] = "__main__" + EVIL
        meta["env"]["hostname"] = EVIL
        meta["env"]["torch"] = EVIL
        meta["env"]["git_commit"] = EVIL
        meta["model"]["class"] = EVIL
        meta["model"]["modules"] = [[n + EVIL, c + EVIL] for n, c in meta["model"]["modules"]]
        meta["optimizer"]["class"] = EVIL
        _blob(f, "meta/run", json.dumps(meta).encode())
        sources = json.loads(f["meta/sources"][()].tobytes())
        sources = {k: v + "\n# " + EVIL + "\n" for k, v in sources.items()}
        _blob(f, "meta/sources", json.dumps(sources).encode())
        f.attrs["run_id"] = "ab\x1b]0;t\x07" + "c" * 30
        # batches whose keys and exception messages carry escapes too (the TUI's batch view shows
        # the last step, doctor reads the first)
        markers = f["steps/step"][()]
        for slot in (_first_slot(f, "steps"), int(np.argmax(markers))):
            _put_record(
                f,
                "steps",
                slot,
                {
                    "step": int(markers[slot]),
                    "rng": {},
                    "hparams": [],
                    "modes": np.ones(3, bool),
                    "batch": {
                        EVIL: np.arange(8, dtype=np.float32).reshape(4, 2),
                        "s": np.array(["a"]),
                    },
                    "exception": {"type": EVIL, "module": "m", "message": EVIL, "traceback": EVIL},
                },
            )

    # Links and storage that would read other files: each must be refused, never followed.
    p, _ = case("external_link_meta", fragment="ExternalLink", replay=True)
    with h5py.File(p, "r+") as f:
        del f["meta/run"]
        f["meta/run"] = h5py.ExternalLink(str(p.parent / "canary.h5"), "/blob")
    _fifo(p.parent / "canary.h5")

    p, _ = case("external_link_passwd", fragment="ExternalLink")
    with h5py.File(p, "r+") as f:
        del f["status"]
        f["status"] = h5py.ExternalLink("/etc/passwd", "/")

    p, _ = case("soft_link_group", fragment="SoftLink")
    with h5py.File(p, "r+") as f:
        f.move("health", "health_real")
        f["health"] = h5py.SoftLink("/health_real")

    p, _ = case("external_storage_fifo", fragment="external files")
    with h5py.File(p, "r+") as f:
        n = f["steps/step"].shape[0]
        del f["steps/step"]
        f.create_dataset(
            "steps/step", shape=(n,), dtype="<i8", external=[(str(p.parent / "raw.bin"), 0, 8 * n)]
        )
    _fifo(p.parent / "raw.bin")

    p, _ = case("external_storage_dev_zero", fragment="external files")
    with h5py.File(p, "r+") as f:
        n, cols = f["health/values"].shape
        del f["health/values"]
        f.create_dataset(
            "health/values",
            shape=(n, cols),
            dtype="<f8",
            external=[("/dev/zero", 0, h5py.h5f.UNLIMITED)],
        )

    p, _ = case("virtual_dataset", fragment="virtual")
    with h5py.File(p, "r+") as f:
        n, cols = f["health/values"].shape
        del f["health/values"]
        layout = h5py.VirtualLayout(shape=(n, cols), dtype="<f8")
        layout[:] = h5py.VirtualSource(str(p.parent / "vds_src.h5"), "x", shape=(n, cols))
        f.create_virtual_dataset("health/values", layout, fillvalue=0)
    _fifo(p.parent / "vds_src.h5")

    p, _ = case("compressed_arena", fragment="filtered")
    with h5py.File(p, "r+") as f:
        data = f["snapshots/arena"][()]
        del f["snapshots/arena"]
        f.create_dataset(
            "snapshots/arena", data=data, chunks=(1, data.shape[1]), compression="gzip"
        )

    # Not a regular file.
    d = out / "fifo_path"
    d.mkdir()
    cases.append(Case("fifo_path", _fifo(d / "run.h5"), fragment="FIFO", replay=True))
    cases.append(Case("dev_zero_path", "/dev/zero", fragment="device"))
    p, _ = case("fifo_sidecar", info=OK, doctor=OK, tui="opens")
    _fifo(p.parent / "run.forensics.h5")

    # Sizes that claim far more than the file holds.
    p, _ = case("health_claims_2_27_rows", fragment="slots")
    with h5py.File(p, "r+") as f:
        cols = f["health/values"].shape[1]
        del f["health/step"], f["health/values"]
        n = 1 << 27
        f.create_dataset("health/step", shape=(n,), dtype="<i8", fillvalue=-1, chunks=(8192,))
        f.create_dataset(
            "health/values", shape=(n, cols), dtype="<f8", fillvalue=np.nan, chunks=(1024, cols)
        )
        f["health"].attrs["slots"] = n

    # Exactly at the limits: must be read, within bounded memory (the tests' 2 GiB address space).
    p, _ = case("health_at_the_limit", info=OK, doctor=OK, tui="opens")
    with h5py.File(p, "r+") as f:
        old = json.loads(f["health"].attrs["columns"])
        columns = old + [f"extra_{i}" for i in range(32 - len(old))]
        rows = f["health/values"][: 1 << 13]
        steps = f["health/step"][: 1 << 13]
        del f["health/step"], f["health/values"]
        n = 1 << 20  # 2^20 rows x 32 columns x 8 bytes = 256 MiB of (mostly fill) values
        hs = f.create_dataset("health/step", shape=(n,), dtype="<i8", fillvalue=-1, chunks=(8192,))
        hv = f.create_dataset(
            "health/values", shape=(n, 32), dtype="<f8", fillvalue=np.nan, chunks=(1024, 32)
        )
        hs[: len(steps)] = steps
        hv[: len(rows), : len(old)] = rows
        if "crc" in f["health"]:  # the rows changed width: their checksums, as a crafter would
            del f["health/crc"]
            hc = f.create_dataset("health/crc", shape=(n,), dtype="<i8", chunks=(8192,))
            filled = hv[: len(rows)]
            hc[: len(steps)] = [
                health_crc(int(st), filled[i]) if st >= 0 else 0 for i, st in enumerate(steps)
            ]
        f["health"].attrs["slots"] = n
        f["health"].attrs["columns"] = json.dumps(columns)
        meta = _meta(f)
        meta["config"]["health_slots"] = n
        _blob(f, "meta/run", json.dumps(meta).encode())

    p, _ = case("health_just_past_the_limit", fragment="/health/values")
    with h5py.File(p, "r+") as f:
        old = json.loads(f["health"].attrs["columns"])
        f["health"].attrs["columns"] = json.dumps(old + [f"x{i}" for i in range(33 - len(old))])
        f["health"].attrs["slots"] = 1 << 20

    p, _ = case("health_slots_mismatch", fragment="/health/values")
    with h5py.File(p, "r+") as f:
        n, cols = f["health/values"].shape
        del f["health/values"]
        f.create_dataset("health/values", shape=(n, cols + 3), dtype="<f8", fillvalue=np.nan)

    p, _ = case("payload_claims_a_terabyte", info=OK, tui="fails", fragment="claims")
    with h5py.File(p, "r+") as f:
        arena = f["steps/arena"]
        arena.resize((arena.shape[0], 1 << 40))
        f["steps/nbytes"][_first_slot(f, "steps")] = 1 << 39

    p, _ = case("huge_chunks", fragment="chunks")
    with h5py.File(p, "r+") as f:
        n = f["steps/arena"].shape[0]
        del f["steps/arena"]
        f.create_dataset(
            "steps/arena", shape=(n, 1 << 28), maxshape=(n, None), dtype="|u1", chunks=(1, 1 << 28)
        )

    p, _ = case("nbytes_past_arena", info=OK, tui="opens", fragment="arena row")
    with h5py.File(p, "r+") as f:
        f["snapshots/nbytes"][_first_slot(f, "snapshots")] = f["snapshots/arena"].shape[1] + 1

    # DDP rank set whose world size would make a list of a billion missing ranks.
    d = out / "world_size_1e9"
    d.mkdir()
    for r in (0, 1):
        rp = d / f"run.rank{r}.h5"
        shutil.copy(base, rp)
        with h5py.File(rp, "r+") as f:
            meta = _meta(f)
            meta["distributed"] = {
                "rank": r,
                "world_size": 10**9,
                "backend": "gloo",
                "local_rank": r,
            }
            _blob(f, "meta/run", json.dumps(meta).encode())
    # Every rank file damaged: an incomplete rank set (exit 7), named, never guessed over.
    cases.append(
        Case(
            "world_size_1e9",
            str(d / "run.h5"),
            info=INCOMPLETE,
            doctor=INCOMPLETE,
            fragment="world_size",
            replay=True,
        )
    )

    # Attributes of the wrong shape or type.
    for name, obj, key, value in (
        ("array_format_version", "/", "format_version", np.array([1, 1])),
        ("array_ring_slots", "steps", "slots", np.array([10, 10])),
        ("array_created", "/", "created", np.arange(3.0)),
        ("string_health_slots", "health", "slots", "100000"),
        ("array_status_fields", "status", "fields", np.array([b"closed", b"x"])),
    ):
        p, _ = case(name, fragment=f"{key!r}")
        with h5py.File(p, "r+") as f:
            f[obj].attrs[key] = value

    # JSON nested to exhaust a recursive parser, and a record manifest nested the same way.
    p, _ = case("deep_json_meta", fragment="nested", replay=True)
    with h5py.File(p, "r+") as f:
        _blob(f, "meta/run", b"[" * 100_000 + b"]" * 100_000)

    p, _ = case("deep_json_columns", fragment="nested")
    with h5py.File(p, "r+") as f:
        f["health"].attrs["columns"] = "[" * 5000 + "]" * 5000

    p, _ = case("deep_manifest", info=OK, tui="fails", fragment="nested")
    with h5py.File(p, "r+") as f:
        deep = '{"t":"list","v":[' * 3000 + "]}" * 3000
        _put_payload(f, "steps", _first_slot(f, "steps"), deep.encode(), b"")

    p, _ = case("meta_wrong_types", fragment="/meta/run")
    with h5py.File(p, "r+") as f:
        meta = _meta(f)
        meta["model"]["params"] = [["w", "not a shape", "f", True]]
        meta["entry"]["step_fn"] = ["a list"]
        _blob(f, "meta/run", json.dumps(meta).encode())

    p, _ = case("meta_config_disagrees", fragment="step_slots")
    with h5py.File(p, "r+") as f:
        meta = _meta(f)
        meta["config"]["step_slots"] = 10**6
        _blob(f, "meta/run", json.dumps(meta).encode())

    p, _ = case("meta_config_string", fragment="start_step")
    with h5py.File(p, "r+") as f:
        meta = _meta(f)
        meta["config"]["start_step"] = "zero"
        _blob(f, "meta/run", json.dumps(meta).encode())

    # Well-formed records of unexpected shapes (a custom optimizer's state dict, or a crafted
    # one): readers take them as "no per-parameter state", never an exception.
    p, _ = case("snapshot_odd_optimizer", info=OK, doctor=OK, tui="opens")
    with h5py.File(p, "r+") as f:
        m = f["snapshots/step"][()]
        for slot in np.flatnonzero(m >= 0):
            odd = {"param_groups": [1, "x", {"params": "ab"}], "state": [1, 2]}
            _put_record(
                f,
                "snapshots",
                int(slot),
                {"step": int(m[slot]), "model": {"0.weight": "w", "0.bias": [1]}, "optimizer": odd},
            )

    p, _ = case("meta_not_utf8", fragment="UTF-8")
    with h5py.File(p, "r+") as f:
        _blob(f, "meta/run", b'{"config": "\xff\xfe"}')

    # /status shorter than its fields, or holding nonsense.
    p, _ = case("short_status", fragment="/status", replay=True)
    with h5py.File(p, "r+") as f:
        fields = f["status"].attrs["fields"]
        del f["status"]
        f.create_dataset("status", data=np.array([1, 5], np.int64))
        f["status"].attrs["fields"] = fields

    p, _ = case("status_nonsense", fragment="/status")
    with h5py.File(p, "r+") as f:
        f["status"][:] = [7, -5, -1, 2**62]

    p, _ = case("status_float", fragment="/status")
    with h5py.File(p, "r+") as f:
        fields = f["status"].attrs["fields"]
        del f["status"]
        f.create_dataset("status", data=np.zeros(4, np.float64))
        f["status"].attrs["fields"] = fields

    # Record manifests that point outside their arena or are not JSON / UTF-8.
    p, _ = case("manifest_leaf_outside_arena", info=OK, tui="fails", fragment="outside")
    with h5py.File(p, "r+") as f:
        m = {"t": "ndarray", "dtype": "<f4", "shape": [1 << 20], "off": 0, "n": 4 << 20}
        _put_payload(f, "steps", _first_slot(f, "steps"), json.dumps(m).encode(), b"\0" * 16)

    p, _ = case("manifest_bad_offset_utf8", info=OK, tui="opens", fragment="UTF-8")
    with h5py.File(p, "r+") as f:
        _put_payload(f, "snapshots", _first_slot(f, "snapshots"), '{"t": "é'.encode()[:-1], b"")

    p, _ = case("manifest_mlen_past_nbytes", info=OK, tui="opens", fragment="manifest")
    with h5py.File(p, "r+") as f:
        slot = _first_slot(f, "snapshots")
        f["snapshots/mlen"][slot] = int(f["snapshots/nbytes"][slot]) + 1

    p, _ = case("manifest_object_dtype", info=OK, tui="fails", fragment="dtype")
    with h5py.File(p, "r+") as f:
        m = {"t": "ndarray", "dtype": "|O", "shape": [2], "off": 0, "n": 16}
        _put_payload(f, "steps", _first_slot(f, "steps"), json.dumps(m).encode(), b"\0" * 16)

    p, _ = case("manifest_unhashable_key", info=OK, tui="fails", fragment="cannot be a key")
    with h5py.File(p, "r+") as f:
        key = {"t": "tuple", "v": [{"t": "list", "v": []}]}  # a tuple holding a list: unhashable
        m = {"t": "dict", "k": [key], "v": [{"t": "none"}]}
        _put_payload(f, "steps", _first_slot(f, "steps"), json.dumps(m).encode(), b"")

    p, _ = case("record_of_another_step", info=OK, tui="opens", fragment="holds the record")
    with h5py.File(p, "r+") as f:
        slot = _first_slot(f, "snapshots")
        _put_record(f, "snapshots", slot, {"step": 123456, "model": {}, "optimizer": {}})

    # Ring markers out of range: int64 max made `verify` report success with nothing compared.
    p, _ = case("marker_int64_max", fragment="not a step", replay=True)
    with h5py.File(p, "r+") as f:
        f["steps/step"][_first_slot(f, "steps")] = np.iinfo(np.int64).max

    p, _ = case("health_marker_negative", fragment="not a step")
    with h5py.File(p, "r+") as f:
        f["health/step"][0] = -(2**40)

    p, _ = case("marker_in_wrong_slot", fragment="belongs in slot")
    with h5py.File(p, "r+") as f:
        m = f["steps/step"][()]
        slot = _first_slot(f, "steps")
        f["steps/step"][slot] = int(m[slot]) + 1

    p, _ = case("ring_dtype_float", fragment="dtype")
    with h5py.File(p, "r+") as f:
        m = f["snapshots/step"][()]
        del f["snapshots/step"]
        f.create_dataset("snapshots/step", data=m.astype(np.float64))

    return cases


def truncation_cases(base: Path, out: Path) -> list[Case]:
    """The real recording cut at every 10% of its length (a copy interrupted, a full disk)."""
    raw = base.read_bytes()
    cases = []
    for pct in range(0, 100, 10):
        d = out / f"truncated_{pct:02d}"
        d.mkdir()
        p = d / "run.h5"
        p.write_bytes(raw[: len(raw) * pct // 100])
        # Cut files may still open (what was flushed early is readable): 0 or 3, never a crash.
        cases.append(Case(f"truncated_{pct:02d}", str(p), info=-1, doctor=-1, tui="either"))
    return cases


# -- sidecars ---------------------------------------------------------------------------------------


def sidecar_tables(run_id: str, n_ops: int = 40, evil: str = "") -> dict:
    """Small, consistent forensics tables (what ``TraceResult.to_tables()`` returns)."""
    e = evil
    ops = {
        "phase": np.zeros(n_ops, np.uint8),
        "name": (np.arange(n_ops) % 3).astype(np.int32),
        "module": (np.arange(n_ops) % 2).astype(np.int32),
        "source": np.zeros(n_ops, np.int32),
        "stack": np.zeros(n_ops, np.int32),
        "node": np.full(n_ops, -1, np.int32),
        "status": np.zeros(n_ops, np.uint8),
        "inputs": np.zeros(n_ops, np.int32),
        "outputs": np.zeros(n_ops, np.int32),
        "stats": np.ones((n_ops, 10)),
        "hist": np.ones((n_ops, 16), np.float32),
        "mem_bytes": np.arange(n_ops, dtype=np.int64),
        "time_ns": np.ones(n_ops, np.int64),
    }
    ops["status"][5] = 1
    src = "/x/model" + e + ".py"
    return {
        "verdict": {
            "step": 10,
            "kind": "nonfinite",
            "op_index": 5,
            "op": "aten::log" + e,
            "phase": "forward",
            "module": "0" + e,
            "source": {"file": src, "line": 3, "function": "f" + e, "code": "x" + e},
            "samples": [1],
            "notes": ["n" + e],
        },
        "ops": ops,
        "strings": {
            "ops": ["aten::mm" + e, "aten::log" + e, "aten::add"],
            "modules": ["0" + e, "3"],
            "locations": [f"{src}:3:forward{e}"],
            "stacks": ["[0]"],
            "shapes": ["float32[8,8]@cpu" + e],
            "module_kinds": ["Linear" + e],
            "params": ["0.weight" + e],
            "nodes": [],
        },
        "modules": {
            "name": np.array([0, 1], np.int32),
            "kind": np.array([0, 0], np.int32),
            "parent": np.array([-1, 0], np.int32),
            **{
                c: np.ones(2)
                for c in ("act_mean", "act_std", "act_absmax", "act_zero_frac", "act_nonfinite")
            },
            "n_ops": np.ones(2, np.int32),
        },
        "params": {
            "name": np.zeros(1, np.int32),
            "numel": np.ones(1, np.int64),
            "requires_grad": np.ones(1, bool),
            "has_grad": np.ones(1, bool),
            **{
                c: np.ones(1)
                for c in (
                    "grad_norm",
                    "grad_nan",
                    "grad_inf",
                    "weight_norm",
                    "weight_mean",
                    "weight_std",
                    "update_norm",
                    "update_ratio",
                )
            },
        },
        "memory": {
            "peak_bytes": 100,
            "peak_op": 3,
            "largest": [
                {
                    "shape": [8, 8],
                    "dtype": "float32" + e,
                    "bytes": 256,
                    "op_index": 3,
                    "op": "mm" + e,
                }
            ],
        },
        "sources": {src: {"sha256": "0", "lines": {"3": "    return x.log()" + e}}},
        "batch": {"batch_size": 4, "leaves": [], "culprits": []},
    }


def sidecar_cases(base: Path, out: Path, run_id: str) -> list[Case]:
    """A valid recording next to a crafted sidecar. ``info`` never reads a sidecar; ``doctor``
    treats an unreadable one as absent; the TUI opens the recording and shows why the sidecar was
    refused (``tui="opens"``). The sidecar with escapes is valid and must be shown safely."""
    cases: list[Case] = []

    def case(name: str, evil: str = "") -> Path:
        p = _copy(base, out, name)
        side = p.parent / "run.forensics.h5"
        write_forensics(side, run_id=run_id, step=10, tables=sidecar_tables(run_id, evil=evil))
        cases.append(
            Case(name, str(p), info=OK, doctor=OK, tui="opens", notes={"sidecar_ok": bool(evil)})
        )
        return side

    case("sidecar_escapes", evil=EVIL)
    side = case("sidecar_index_out_of_range")
    with h5py.File(side, "r+") as f:
        f["ops/name"][7] = 999
    side = case("sidecar_deep_verdict")
    with h5py.File(side, "r+") as f:
        _blob(f, "verdict/json", b"[" * 50_000 + b"]" * 50_000)
    side = case("sidecar_external_link")
    with h5py.File(side, "r+") as f:
        del f["strings/ops"]
        f["strings/ops"] = h5py.ExternalLink(str(side.parent / "canary.h5"), "/x")
    _fifo(side.parent / "canary.h5")
    side = case("sidecar_bad_stack")
    with h5py.File(side, "r+") as f:
        _blob(f, "strings/stacks", json.dumps(["[0, 99]"]).encode())
    side = case("sidecar_verdict_op_index")
    with h5py.File(side, "r+") as f:
        v = json.loads(f["verdict/json"][()].tobytes())
        v["op_index"] = 10**9
        _blob(f, "verdict/json", json.dumps(v).encode())
    side = case("sidecar_columns_differ")
    with h5py.File(side, "r+") as f:
        del f["ops/time_ns"]
        f.create_dataset("ops/time_ns", data=np.ones(3, np.int64))
    side = case("sidecar_largest_not_numbers")
    with h5py.File(side, "r+") as f:
        _blob(f, "memory/largest", json.dumps([{"op_index": "x", "bytes": []}]).encode())
    side = case("sidecar_array_attr")
    with h5py.File(side, "r+") as f:
        f.attrs["format_version"] = np.array([1, 1])
    return cases

"""The typed contracts between the recorder, the writer and the readers (no torch here).

- :class:`StepFrame`, :class:`SnapshotFrame`, :class:`HealthFrame`: one item of a commit, from
  the writer thread through the writer process's pipe (or the step log) to
  :meth:`StoreWriter.commit <replay.store.writer.StoreWriter.commit>`. Their wire form (the
  commit header's lists, docs in ``writer_process.py``) and the file format do not change.
- :data:`HEALTH_KEYS`: every name the recorder may measure into a step's health. A name outside
  it is a bug in the caller, and ``capture.health.health_row`` raises on it instead of dropping
  it silently.
- :class:`RunMeta`: the run's metadata (``/meta/run``), built by the recorder, read by everyone
  by name (a parameter is a :class:`ParamMeta`, not ``p[1]``).
- :class:`StepRecord`: the record a step payload encodes (docs/format.md, ``/steps``).
- :class:`Phase` and :class:`OpStatus`: the per-op phase and status of the forensics sidecar
  (docs/forensics.md), ``str`` enums so that JSON output and comparisons with the plain strings
  stay what they were; ``code`` is the value of the file's ``uint8`` column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypedDict, cast

import numpy as np
from typing_extensions import NotRequired

from .layout import HEALTH_COLUMNS

__all__ = [
    "Payload",
    "StepFrame",
    "SnapshotFrame",
    "HealthFrame",
    "HEALTH_KEYS",
    "HEALTH_INPUTS",
    "HEALTH_DERIVED",
    "OBJECT_KEYS",
    "check_health_keys",
    "StepRecord",
    "StepException",
    "RunMeta",
    "RunConfig",
    "ModelMeta",
    "ModuleMeta",
    "ParamMeta",
    "Phase",
    "OpStatus",
]

#: A payload: one uint8 array, or the parts whose concatenation it is (``pack_parts``), sent
#: one after the other without being joined first.
Payload = np.ndarray | list[np.ndarray]


@dataclass(frozen=True)
class StepFrame:
    """One step's encoded record (manifest JSON, then buffers) for the ``steps`` ring."""

    step: int
    payload: Payload
    mlen: int  # the manifest's length in bytes, at the payload's start


@dataclass(frozen=True)
class SnapshotFrame:
    """One snapshot's encoded state for slot ``slot`` of the ``snapshots`` ring."""

    slot: int
    step: int
    payload: Payload
    mlen: int


@dataclass(frozen=True)
class HealthFrame:
    """One step's health row: float64 values in ``HEALTH_COLUMNS`` order."""

    step: int
    row: np.ndarray


# Columns computed from the measured values by ``health_row`` (flags, the process's memory):
# never passed in.
HEALTH_DERIVED = frozenset(
    {
        "loss_nonfinite",
        "grad_nonfinite",
        "param_nonfinite",
        "scaler_skipped",
        "rss",
        "local_grad_nonfinite",
    }
)
# Measured values that are not columns: they decide a flag exactly (a norm overflows while every
# element is still finite; the scale after the step says whether the GradScaler skipped it).
HEALTH_INPUTS = frozenset({"grad_absmax", "param_absmax", "scale_after"})
#: Every name a step's health may carry: the measured columns, and the inputs above.
HEALTH_KEYS = (frozenset(HEALTH_COLUMNS) - HEALTH_DERIVED) | HEALTH_INPUTS


#: What a watched object's health may carry, as ``<object>__<name>`` (``netG__grad_norm``).
OBJECT_KEYS = frozenset({"grad_norm", "grad_absmax", "param_fingerprint", "param_absmax"})


def check_health_keys(names: Any) -> None:
    """Raise ``KeyError`` naming any of ``names`` that is not in :data:`HEALTH_KEYS` or a
    watched object's ``<object>__<key>`` with a key of :data:`OBJECT_KEYS`."""
    unknown = sorted(
        n
        for n in set(names) - HEALTH_KEYS
        if not (
            isinstance(n, str) and n.rpartition("__")[0] and n.rpartition("__")[2] in OBJECT_KEYS
        )
    )
    if unknown:
        raise KeyError(
            f"unknown health key(s) {', '.join(unknown)}: the health names are "
            f"{', '.join(sorted(HEALTH_KEYS))} (replay/store/contracts.py)"
        )


class StepException(TypedDict):
    """What a step that raised recorded about its exception."""

    type: str
    module: str
    message: str
    traceback: str


class StepRecord(TypedDict):
    """The tree a step payload encodes, keys in this order (docs/format.md, ``/steps``)."""

    step: int
    rng: Any
    hparams: Any
    modes: np.ndarray  # bool, one per module in ``named_modules()`` order
    batch: Any
    exception: StepException | None
    values: Any  # per-step values (``rec.step(batch, **values)``) or None
    # v3, MAY: the batch by reference (batch is None): {"indices", "batched", "sha256"}
    batch_ref: NotRequired[dict[str, Any]]
    # MAY: requires_grad of every parameter of the run (``capture.objects.trainable_params``
    # order), on the first step and each step where it changed (gradual unfreezing)
    trainable: NotRequired[np.ndarray]
    # MAY: {optimizer name: groups, like hparams} of every other named optimizer of the run
    object_hparams: NotRequired[dict[str, Any]]
    # MAY: {"qualname", "over"}: the step was handed another step function than the step before
    # ("over": null), or the same code over another object of its closure (its name)
    step_fn: NotRequired[dict[str, Any]]


class _StrEnum(str, Enum):
    """A ``str`` whose ``str()``/``format()`` is its value (``enum.StrEnum`` is Python 3.11+)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @property
    def code(self) -> int:
        """The value stored in the file's ``uint8`` column: the member's position."""
        return _CODES[self]


class Phase(_StrEnum):
    """When an op ran: the order is the file's encoding (docs/forensics.md, ``/ops/phase``)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class OpStatus(_StrEnum):
    """An op's part in a failure: the order is the file's encoding (``/ops/status``)."""

    FINITE = "finite"
    PRODUCER = "producer"
    PROPAGATOR = "propagator"
    RAISED = "raised"
    EXEMPT = "exempt"


_CODES: dict[Enum, int] = {m: i for e in (Phase, OpStatus) for i, m in enumerate(e)}


# -- run metadata (/meta/run, docs/format.md) ---------------------------------------------------


class RunConfig(TypedDict):
    """``/meta/run`` ``config``: how the recorder was set up."""

    snapshot_every: int
    fingerprint_every: int
    keep_snapshots: int
    snapshot_slots: int  # v3: /snapshots slots (v1, v2: keep_snapshots)
    reach: int  # v3: steps asked to stay replayable
    keep_bytes: int  # v3: the bound on step records' bytes
    step_slots: int
    health_slots: int
    start_step: int
    raise_on_nonfinite: bool


@dataclass(frozen=True)
class ParamMeta:
    """One parameter, in ``named_parameters()`` order; on disk ``[name, shape, dtype, bool]``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool

    def to_json(self) -> list[Any]:
        return [self.name, list(self.shape), self.dtype, self.requires_grad]

    @classmethod
    def from_json(cls, row: list[Any]) -> ParamMeta:
        name, shape, dtype, requires_grad = row  # validate.check_meta checked the types
        return cls(str(name), tuple(int(s) for s in shape), str(dtype), bool(requires_grad))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModuleMeta:
    """One module, in ``named_modules()`` order (the order of a step's ``modes``); on disk
    ``[name, class]``."""

    name: str
    cls: str

    def to_json(self) -> list[str]:
        return [self.name, self.cls]

    @classmethod
    def from_json(cls, row: list[Any]) -> ModuleMeta:
        name, klass = row
        return cls(str(name), str(klass))


@dataclass(frozen=True)
class ModelMeta:
    """``/meta/run`` ``model``."""

    cls: str
    modules: tuple[ModuleMeta, ...]
    params: tuple[ParamMeta, ...]
    param_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "modules": [m.to_json() for m in self.modules],
            "params": [p.to_json() for p in self.params],
            "param_bytes": self.param_bytes,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelMeta:
        return cls(
            cls=str(d.get("class") or ""),
            modules=tuple(ModuleMeta.from_json(m) for m in d.get("modules") or []),
            params=tuple(ParamMeta.from_json(p) for p in d.get("params") or []),
            param_bytes=int(d.get("param_bytes") or 0),
        )


def _class_of(d: Any) -> str | None:
    return str(d["class"]) if isinstance(d, dict) and d.get("class") is not None else None


@dataclass(frozen=True)
class RunMeta:
    """``/meta/run``: what the recorder writes and the readers read. ``to_json`` is the blob,
    its keys in the order they always had (the file's bytes do not change); ``from_json`` reads
    one that ``validate.check_meta`` accepted, older files' missing parts as empty."""

    config: RunConfig
    entry: dict[str, dict[str, Any]]  # role (step_fn, build_fn) -> module, qualname, path, ...
    env: dict[str, Any]
    model: ModelMeta
    optimizer: str | None  # class names; None where there is none
    objects: dict[str, Any] | None
    scheduler: str | None
    scaler: str | None
    distributed: dict[str, Any] | None
    # keyword arguments replay passes to build_fn (replay.integrations); written only when set,
    # so that a plain run's blob is what it always was
    build_kwargs: dict[str, Any] | None = None
    # why the steps cannot be replayed (a framework feature replay does not rebuild): no
    # snapshots, the health and batches only; written only when set
    not_replayable: str | None = None
    # how to run the recorded program again (replay by re-entry, docs/reentry.md): written when
    # the program can be run again; ``{"kind": "script"|"module", "path", "module", "sha256"}``
    program: dict[str, Any] | None = None
    # v3: the snapshot tiers and the reach they give (store/retention.py ``ReachPlan.meta``)
    reach: dict[str, Any] | None = None
    # json-blobs v2: the recorder's HMAC over what decides what replay runs (replay/trust.py),
    # ``{"version", "alg", "key", "mac"}``; written only when signed
    signature: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        def named(c: str | None) -> dict[str, str] | None:
            return {"class": c} if c is not None else None

        def given(**parts: Any) -> dict[str, Any]:  # the keys written only when set
            return {k: v for k, v in parts.items() if v is not None}

        return {
            "config": dict(self.config),
            "entry": self.entry,
            **given(build_kwargs=self.build_kwargs or None),
            **given(not_replayable=self.not_replayable, program=self.program),
            "env": self.env,
            "model": self.model.to_json(),
            "optimizer": named(self.optimizer),
            "objects": self.objects,
            "scheduler": named(self.scheduler),
            "scaler": named(self.scaler),
            "distributed": self.distributed,
            **given(reach=self.reach, signature=self.signature),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunMeta:
        return cls(
            config=cast(RunConfig, d.get("config") or {}),  # older files: partial
            entry=d.get("entry") or {},
            env=d.get("env") or {},
            model=ModelMeta.from_json(d.get("model") or {}),
            optimizer=_class_of(d.get("optimizer")),
            objects=d.get("objects"),
            scheduler=_class_of(d.get("scheduler")),
            scaler=_class_of(d.get("scaler")),
            distributed=d.get("distributed"),
            build_kwargs=d.get("build_kwargs") or None,
            not_replayable=d.get("not_replayable"),
            program=d.get("program") if isinstance(d.get("program"), dict) else None,
            reach=d.get("reach") if isinstance(d.get("reach"), dict) else None,
            signature=d.get("signature") if isinstance(d.get("signature"), dict) else None,
        )

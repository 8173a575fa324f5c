"""``InfoReport``: ``replay info --json``, what a recording holds; ``RecordingSteps``: its steps,
health and state, also each rank's row of a rank set. ``to_json()`` keeps the field order."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .verdict import Ended, JSONObject

__all__ = ["BitwiseCuda", "Hparams", "InfoReport", "RecordingSteps", "Segment", "Truncation"]
__all__ += ["Trust", "Writer"]


@dataclass(frozen=True)
class Writer:
    """The live writer of the file, from its lock: still recording, or ``draining`` after its
    training died (with the steps it still has to commit)."""

    draining: bool
    steps_to_come: int | None
    pid: int | None  # the training process
    writer_pid: int | None


@dataclass(frozen=True)
class Truncation:
    """The file ends (``size`` bytes) before the end its HDF5 superblock ``claimed``."""

    size: int
    claimed: int


@dataclass(frozen=True)
class Segment:
    """Another segment of the recording (a resumed run's ``run.1.h5``) and the steps its health
    holds (``None``: it cannot be read, it is only named)."""

    path: str
    health_steps: list[int] | None


@dataclass(frozen=True)
class Hparams:
    """Every optimizer's numeric hyper-parameters, per param group, at the newest step kept."""

    step: int
    optimizers: dict[str, list[dict[str, float]]]


@dataclass(frozen=True)
class Trust:
    """Whether the replaying commands would run the recording's code (docs/trust.md)."""

    standing: str  # signed, trusted or foreign
    why: str
    line: str


@dataclass(frozen=True)
class BitwiseCuda:
    """Whether a CUDA run can replay bitwise, as its recorded settings say, and why not."""

    possible: bool
    why_not: list[str]


@dataclass(kw_only=True)
class RecordingSteps:
    """What a recording's rings hold (``[first, last]`` spans, ``None``: none), its health,
    whether it closed, its writer, damage, self-check verdict (with its ``line``) and segments."""

    steps_recorded: int
    health_steps: list[int] | None
    batch_steps: list[int] | None
    batch_count: int
    snapshots: list[int]
    replayable_window: list[int] | None
    reach: JSONObject  # tiers, step_slots, snapshot_slots, reach
    not_replayable: str | None
    first_bad: dict[str, int | None]  # nonfinite, exception
    last_loss: float | None  # the last finite one
    closed_cleanly: bool
    ended: Ended | None  # the program raised outside any step (the file's /ended)
    writer: Writer | None
    truncated: Truncation | None = None
    damaged_steps: list[int]
    damaged_health: list[int]
    self_check: JSONObject | None
    segments: list[Segment]
    watched_objects: list[str]
    hparams: Hparams | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class InfoReport:
    """Everything ``replay info`` shows of one recording: its ``steps`` (flat in the JSON),
    what ``/meta/run`` recorded (``config``, ``entry``, ``env``, ... as written) and what is
    judged here: ``bitwise_cuda``, ``environ_here`` (the recorded variables that differ here,
    ``None``: cannot be told) and ``trust``."""

    path: str
    format: str = "replay-recording"
    format_version: int
    run_id: str
    created: float
    steps: RecordingSteps
    config: JSONObject
    entry: dict[str, JSONObject]  # role -> module, qualname, path
    program: JSONObject | None
    env: JSONObject
    bitwise_cuda: BitwiseCuda | None
    environ_here: list[str] | None
    model: JSONObject  # class, param_bytes, n_params
    optimizer: JSONObject | None
    scheduler: JSONObject | None
    scaler: JSONObject | None
    objects: JSONObject | None
    distributed: JSONObject | None
    trust: Trust

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        head = {k: out.pop(k) for k in ("path", "format", "format_version", "run_id", "created")}
        return {**head, **out.pop("steps"), **out}

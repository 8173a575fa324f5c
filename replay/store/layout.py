"""Names, versions and health columns of the recording format (see docs/format.md)."""

from __future__ import annotations

FORMAT_NAME = "replay-recording"
FORMAT_VERSION = 4  # v4: a tensor leaf's strides (a non-contiguous batch); v3: tiered snapshots
# Versions this reader understands. Older ones are listed here while they stay readable.
READABLE_VERSIONS = (1, 2, 3, 4)

RING_ENCODING = ("ring", 2)  # v2: a crc dataset (slot checksums)
HEALTH_ENCODING = ("health-ring", 2)  # v2: a crc dataset (row checksums)
META_ENCODING = ("json-blobs", 2)  # v2: meta/run.signature (replay/trust.py)

# Health columns, one float64 each. NaN means "not measured at this step".
HEALTH_COLUMNS = (
    "loss",  # the value step_fn returned, as float64 (exact for float32/16)
    "grad_norm",  # global L2 norm of gradients, measured in an optimizer step pre-hook
    "param_fingerprint",  # sum of per-parameter L2 norms after the step (float64)
    "loss_nonfinite",  # 1.0 when the loss is NaN/Inf
    "grad_nonfinite",  # 1.0 when a gradient held NaN/Inf before the update
    "param_nonfinite",  # 1.0 when a parameter held NaN/Inf after the update
    "optimizer_stepped",  # 1.0 when optimizer.step ran inside the step
    "scale",  # GradScaler scale before the step (NaN without a scaler)
    "scaler_skipped",  # 1.0 when the GradScaler skipped the optimizer step (inf grads)
    "lr",  # learning rate of param group 0
    "raised",  # 1.0 when the step raised an exception
    "wall_time",  # seconds spent in step_fn
    "time",  # unix time at the end of the step
    "cuda_allocated",  # bytes, torch.cuda.memory_allocated() (NaN on the CPU)
    "cuda_peak",  # bytes, torch.cuda.max_memory_allocated()
    "rss",  # bytes, resident set size of the process
    # Appended for DDP (older files lack them; readers look columns up by name, missing = NaN).
    "local_grad_norm",  # this rank's gradient norm before the all-reduce (NaN outside DDP)
    "local_grad_nonfinite",  # 1.0 when this rank's own gradients held NaN/Inf before the all-reduce
)
COL = {name: i for i, name in enumerate(HEALTH_COLUMNS)}

STATUS_FIELDS = ("closed", "last_step", "steps_total", "snapshots_total")
#: ``/ended``'s size: how the program ended when it raised outside any step (docs/format.md)
ENDED_BYTES = 16384

# Per-object columns (appended after HEALTH_COLUMNS, written only when the run has them): every
# model and optimizer among the run's named objects beyond ``model`` and ``optimizer`` (whose
# health the columns above hold) gets these, named ``<object>__<metric>`` (``netG__grad_norm``):
# an identifier, so ``replay bisect --until`` expressions can use it.
OBJECT_METRICS = (
    "grad_norm",  # L2 norm of the object's gradients, before any clip and before its update
    "grad_nonfinite",  # 1.0 when one of its gradients held NaN/Inf before the update
    "param_fingerprint",  # sum of per-parameter L2 norms after the step (fingerprint steps)
    "param_nonfinite",  # 1.0 when one of its parameters held NaN/Inf after the update
)
OBJECT_SEP = "__"


def object_columns(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The health columns of the watched objects ``names``, in the order the row holds them."""
    return tuple(f"{n}{OBJECT_SEP}{m}" for n in names for m in OBJECT_METRICS)


def split_object_column(column: str) -> tuple[str, str] | None:
    """``("netG", "grad_norm")`` for ``"netG__grad_norm"``; ``None`` for a plain column."""
    name, sep, metric = column.rpartition(OBJECT_SEP)
    if not sep or not name or metric not in OBJECT_METRICS:
        return None
    return name, metric

"""Whether a recorded run can replay bitwise on CUDA, and what a replay runs with that the
recording did not, read from the recorded environment (``env``, docs/format.md) without torch:
``replay info`` says it, the recorder warns with it once at start, verify names it where two
replays agree and the recording does not (``capture/numerics.py`` records and applies them).
"""

from __future__ import annotations

from typing import Any

__all__ = ["cuda_blockers", "differences"]

#: Compared, never applied: a replay cannot change its GPU or its libraries.
_COMPARED = ("torch", "cuda", "cudnn", "cuda_driver", "devices")


def cuda_blockers(env: dict[str, Any]) -> list[str]:
    """Why a CUDA run recorded with ``env`` will not replay bitwise (empty: it can, as far as
    its settings say). A CPU-only run has none."""
    if not env.get("devices"):
        return []
    out = []
    if env.get("cudnn_benchmark"):
        out.append("cudnn.benchmark was on (the autotuner may pick other kernels in a replay)")
    if not env.get("deterministic_algorithms"):
        out.append(
            "deterministic algorithms were off (kernels with atomics, e.g. index_add or a "
            "scatter's backward, sum in another order each run)"
        )
    elif env.get("deterministic_warn_only"):
        out.append("deterministic algorithms were warn-only (a kernel without one still ran)")
    cfg = env.get("cublas_workspace_config", "absent")  # absent: an older recording, unknown
    if env.get("deterministic_algorithms") and cfg is None:
        out.append("CUBLAS_WORKSPACE_CONFIG was not set (cuBLAS may reduce in another order)")
    return out


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between the recording's environment and this replay's, one phrase each:
    the versions and GPUs (which cannot be applied), and the settings (after they were)."""
    out = []
    for key in _COMPARED:
        a, b = recorded.get(key), now.get(key)
        if key in recorded and a != b and not (key == "devices" and not a):
            out.append(f"{key} {_show(a)} recorded, {_show(b)} here")
    for key in ("matmul_precision", "cudnn_tf32", "deterministic_algorithms"):
        if key in recorded and key in now and recorded[key] != now[key]:
            out.append(f"{key} {_show(recorded[key])} recorded, {_show(now[key])} here")
    return out


def _show(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "none"
    return str(v)

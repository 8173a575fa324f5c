"""The settings and versions that decide whether a CUDA step replays bitwise: recorded with the
run's environment (``env`` in docs/format.md), applied by a replay before it runs a step, and
compared where they cannot be applied (the GPU, the driver, the libraries).

What they mean is read without torch in ``bitwise.py`` (``replay info`` imports no torch).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any

import torch

from ..errors import RecorderWarning
from ..store.bitwise import cuda_blockers, differences

__all__ = [
    "numerics_env",
    "gpu_names",
    "warn_unless_bitwise",
    "apply_numerics",
    "differences",
    "current_env",
]

#: Settings a replay applies (recorded key -> what it sets). Versions and devices it compares.
_SDPA = ("flash", "mem_efficient", "math", "cudnn")


def _sdpa_enabled() -> dict[str, bool]:
    fns = {k: getattr(torch.backends.cuda, f"{k}_sdp_enabled", None) for k in _SDPA}
    return {k: bool(f()) for k, f in fns.items() if f is not None}


def _driver() -> int | None:
    if not torch.cuda.is_available():
        return None
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    try:
        return int(get()) if get is not None else None
    except (RuntimeError, TypeError, ValueError):
        return None


def numerics_env() -> dict[str, Any]:
    """The keys ``collect_env`` adds for bitwise replay (format.md, ``env``; all MAY)."""
    m = torch.backends.cuda.matmul
    return {
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_enabled": bool(torch.backends.cudnn.enabled),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "matmul_fp16_reduced": bool(m.allow_fp16_reduced_precision_reduction),
        "matmul_bf16_reduced": bool(m.allow_bf16_reduced_precision_reduction),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "sdpa": _sdpa_enabled(),
        "cuda_driver": _driver(),
    }


def gpu_names(cuda: bool) -> list[str]:
    """The GPUs' names where ``cuda`` (naming them initialises CUDA), else none."""
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []


def current_env(on_gpu: bool) -> dict[str, Any]:
    """What a replay here runs with, in the recorded keys it compares. The GPUs are named only
    for a replay on one (``on_gpu``): naming them initialises CUDA, which took a context on a
    GPU of the machine for a CPU replay (a CPU run's self-check beside its training)."""
    cuda = on_gpu and torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,  # type: ignore[no-untyped-call]
        "cuda_driver": _driver(),
        "devices": gpu_names(cuda),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


def warn_unless_bitwise(model: torch.nn.Module | None) -> None:
    """One :class:`RecorderWarning`, at record start, when the model is on a GPU and the
    settings rule out a bitwise replay; nothing for a CPU-only run."""
    if model is None or not any(p.is_cuda for p in model.parameters()):
        return
    now = {
        "devices": ["cuda"],
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        **numerics_env(),
    }
    if blockers := cuda_blockers(now):
        warnings.warn(
            f"replay: this CUDA run will not replay bitwise: {'; '.join(blockers)}; "
            "torch.use_deterministic_algorithms(True), cudnn.benchmark off and "
            "CUBLAS_WORKSPACE_CONFIG=:4096:8 make it (docs/recording.md)",
            RecorderWarning,
            stacklevel=3,
        )


def apply_numerics(env: dict[str, Any], cuda: bool) -> None:
    """Set what ``env`` recorded (keys an older recording lacks are left as they are)."""
    if isinstance(env.get("matmul_precision"), str):
        # (a precision this torch does not know: named by differences())
        with contextlib.suppress(RuntimeError):
            torch.set_float32_matmul_precision(env["matmul_precision"])
    if not cuda:
        return
    m = torch.backends.cuda.matmul
    flags = {
        "cudnn_enabled": (torch.backends.cudnn, "enabled"),
        "cudnn_tf32": (torch.backends.cudnn, "allow_tf32"),
        "matmul_fp16_reduced": (m, "allow_fp16_reduced_precision_reduction"),
        "matmul_bf16_reduced": (m, "allow_bf16_reduced_precision_reduction"),
    }
    for key, (obj, attr) in flags.items():
        if isinstance(env.get(key), bool):
            setattr(obj, attr, env[key])
    sdpa = env.get("sdpa")
    if isinstance(sdpa, dict):
        for name in _SDPA:
            fn = getattr(torch.backends.cuda, f"enable_{name}_sdp", None)
            if fn is not None and isinstance(sdpa.get(name), bool):
                fn(sdpa[name])
    cfg = env.get("cublas_workspace_config")
    if isinstance(cfg, str) and "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = cfg  # read when cuBLAS makes its handle

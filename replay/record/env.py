"""Run metadata: what replay needs to reproduce the numbers, and what a person asks first."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch

from ..capture.environ import environ_digests
from ..capture.numerics import gpu_names, numerics_env

__all__ = ["collect_env"]


def _git_commit(cwd: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=2
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def collect_env(key: bytes | None = None) -> dict[str, Any]:
    """``key``: this user's, for the environment variables' digests (``capture/environ.py``)."""
    # The GPUs the run uses: named only where CUDA is initialised already (the run is on one).
    # Naming them initialises CUDA, and a CPU run on a GPU machine then held a context on a GPU,
    # sent every later step the writer thread's way (``transport._host_run``) and read as a
    # CUDA run to ``replay info`` (``store/bitwise.py``).
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]  # torch stubs
    cwd = os.getcwd()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,  # type: ignore[no-untyped-call]
        "devices": gpu_names(cuda),
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        **numerics_env(),  # what else decides a bitwise CUDA replay (capture/numerics.py)
        "hostname": socket.gethostname(),
        "uid": os.getuid() if hasattr(os, "getuid") else None,
        "platform": platform.platform(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "cwd": cwd,
        "sys_path0": sys.path[0] if sys.path else "",
        "git_commit": _git_commit(cwd),
        "started": time.time(),
        **({"environ": digests} if (digests := environ_digests(key)) else {}),
    }

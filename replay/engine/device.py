"""Where to replay: where the run was recorded when possible, else the CPU (with a warning)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import ReplayError, UsageError, first_line

__all__ = ["choose_device"]


def choose_device(recorded: str, override: str | None, log: Callable[[str], None]) -> str:
    if override:
        try:
            dev = torch.device(override)
        except (RuntimeError, ValueError) as e:
            first = first_line(e)
            raise UsageError(f"--device {override}: not a device torch knows ({first})") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ReplayError(f"--device {override}: no CUDA device is available here")
        if dev.type != torch.device(recorded).type:
            log(
                f"replay: warning: recorded on {recorded}, replaying on {override} as asked: "
                "numerics may differ, so bitwise verification may fail"
            )
        return str(dev)
    if recorded.startswith("cuda"):
        if torch.cuda.is_available():
            index = torch.device(recorded).index or 0
            return f"cuda:{index if index < torch.cuda.device_count() else 0}"
        log(
            f"replay: warning: recorded on {recorded} but no GPU is available here; replaying "
            "on the CPU, where numerics may differ (bitwise verification will likely fail)"
        )
        return "cpu"
    return "cpu" if recorded == "cpu" else recorded

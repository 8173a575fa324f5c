"""The environment variables a run had, kept as keyed digests: which of them a replay runs
without, or with another value, never what any of them held.

A program that reads a variable into its step (``CLIP = float(os.environ["CLIP"])``) replays
otherwise when ``replay bisect`` runs in a shell without it, and verify can only say that the
replays agree with each other and not with the recording. Naming the variable is the fix; keeping
its value is not an option (tokens and passwords live there, and a recording is shared). So the
recording holds, per variable, the first 16 hex digits of HMAC-SHA256 under this user's key
(``trust.py``): a replay by the same user compares them, anyone else learns nothing from them, not
even a short value by guessing (``env.environ`` in docs/format.md).

Variables that differ between any two processes of one job (a shell's, a launcher's port, the
replay's own children: ``OMP_NUM_THREADS`` the self-check sets, ``CUDA_VISIBLE_DEVICES`` its CPU
path empties) are left out on both sides: naming them would hide the one that matters.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from typing import Any

from ..trust import key_id, user_key

__all__ = ["environ_digests", "environ_differences", "differs_here", "VOLATILE"]

#: Names (or, ending in ``_``, prefixes) compared never: a shell's or a launcher's per-process
#: values, and what replay itself sets for the processes it starts.
VOLATILE = (
    "_",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "TERM",
    "TERM_PROGRAM",
    "TERM_PROGRAM_VERSION",
    "COLORTERM",
    "COLUMNS",
    "LINES",
    "PS1",
    "SSH_",
    "TMUX",
    "TMUX_PANE",
    "STY",
    "WINDOW",
    "WINDOWID",
    "DISPLAY",
    "XAUTHORITY",
    "DBUS_SESSION_BUS_ADDRESS",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "REPLAY_",
    "PYTEST_",
    "COV_CORE_",
    "COVERAGE_",
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",  # torchrun's, per launch (replay's rank launcher sets RANK, WORLD_SIZE, ...)
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCHELASTIC_",
    "SLURM_",
    "TORCHINDUCTOR_CACHE_DIR",  # torch sets it in the process (inductor's cache_dir())
    "TRITON_CACHE_DIR",
    "OMPI_",
    "PMI_",
    "PMIX_",
)
_NAMES = frozenset(v for v in VOLATILE if not v.endswith("_") or v == "_")
_PREFIXES = tuple(v for v in VOLATILE if v.endswith("_") and v != "_")

_LISTED = 5  # names a difference lists before "and N more"
_MOST = 4096  # variables compared at most (a shell holds tens to a few hundred)
# a name a recording holds, to be printed: a crafted file's escape sequences never are
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")


def _compared(name: str) -> bool:
    return name not in _NAMES and not name.startswith(_PREFIXES)


def _digest(key: bytes, name: str, value: str) -> str:
    msg = name.encode("utf-8", "surrogateescape") + b"\0" + value.encode("utf-8", "surrogateescape")
    return hmac.new(key, b"replay-environ\0" + msg, hashlib.sha256).hexdigest()[:16]


def environ_digests(key: bytes | None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``env.environ`` of a recording: ``{"key": <key id>, "digests": {name: digest}}``, or
    ``{}`` without a key (nothing is kept that anyone could read a value from)."""
    if key is None:
        return {}
    env = os.environ if env is None else env
    digests = {n: _digest(key, n, v) for n, v in sorted(env.items()) if _compared(n)}
    return {"key": key_id(key), "digests": digests}


def environ_differences(
    recorded: Any, key: bytes | None, env: Mapping[str, str] | None = None
) -> list[str] | None:
    """What differs between the recording's variables and ``env`` (this process's): one phrase
    per variable (``"CLIP (another value here)"``), at most five and a count. ``None`` where it
    cannot be told: an older recording, none kept (no key then), or another user's key."""
    if not isinstance(recorded, dict) or key is None:
        return None
    digests = recorded.get("digests")
    if recorded.get("key") != key_id(key) or not isinstance(digests, dict):
        return None
    if len(digests) > _MOST:  # no environment holds that many: a crafted file, not compared
        return None
    env = os.environ if env is None else env
    here = {n: v for n, v in env.items() if _compared(n)}
    kept = {n for n in digests if isinstance(n, str) and _NAME.fullmatch(n)}
    out: list[str] = []
    for name in sorted(kept | set(here)):
        if not _compared(name):
            continue
        if name not in here:
            out.append(f"{name} (set in the recorded run, unset here)")
        elif name not in kept:
            out.append(f"{name} (set here, not in the recorded run)")
        elif not hmac.compare_digest(str(digests[name]), _digest(key, name, here[name])):
            out.append(f"{name} (another value here)")
    if len(out) > _LISTED:
        out = [*out[:_LISTED], f"and {len(out) - _LISTED} more"]
    return out


def differs_here(recorded: Any) -> list[str] | None:
    """:func:`environ_differences` against this process's environment, under this user's key
    (never made here: a replay creates nothing)."""
    try:
        key = user_key(create=False)
    except (OSError, ValueError):
        return None
    return environ_differences(recorded, key)

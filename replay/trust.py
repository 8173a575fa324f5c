"""Whose recording is this? Trust granted by the user, never claimed by the file.

Jupyter's notebook trust, for recordings (docs/trust.md): a per-user secret key, made on first
use in the user's data directory, and an HMAC-SHA256 over everything in a recording that decides
what replay runs or rebuilds (:func:`signed_payload`). The recorder signs at record time; the
replaying commands run a recording's code only when its signature verifies with this user's
key, when the user trusted it before (``replay trust run.h5``: its digest in the trust store
beside the key), or when they say ``--trust`` once. Fields such as ``hostname`` or ``uid`` prove
nothing: a file can say anything.

No torch here: the recorder's writer thread signs, and ``replay info`` says who signed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TRUST_VERSION",
    "KeyUnusable",
    "Standing",
    "data_dir",
    "user_key",
    "signed_payload",
    "sign",
    "key_id",
    "standing",
    "remember",
]

TRUST_VERSION = 1  # of the signature block and of the payload's encoding
_KEY_FILE = "key"
_STORE_FILE = "trusted"
_KEY_BYTES = 32
_STORE_MOST = 64 << 20  # a million trusted recordings' digests


class KeyUnusable(OSError):
    """The key cannot be made or read (one line: where and why)."""


def data_dir() -> str:
    """``$REPLAY_HOME``, else ``$XDG_DATA_HOME/replay``, else ``~/.local/share/replay``."""
    if home := os.environ.get("REPLAY_HOME"):
        return os.path.abspath(home)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.expanduser("~/.local/share")
    return os.path.join(base, "replay")


def _private_dir() -> str:
    d = data_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError as e:
        raise KeyUnusable(f"cannot make {d}: {e.strerror or e}") from None
    return d


def _read_private(path: str, most: int = 4096) -> bytes:
    """A file of this user's, readable by nobody else, never through a link (its first
    ``most`` bytes)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyUnusable(f"{path} is not a regular file")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise KeyUnusable(f"{path} belongs to another user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            raise KeyUnusable(
                f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                "chmod 600 it, or remove it to make a new key"
            )
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(most)
    finally:
        os.close(fd)


def user_key(create: bool = True) -> bytes | None:
    """This user's key (``None`` when there is none and ``create`` is false). Made atomically:
    written whole to a private temporary file, then linked to its name, which fails for the
    second of two processes making it at once; that one reads the first one's key."""
    path = os.path.join(data_dir(), _KEY_FILE)
    for _ in range(3):
        try:
            raw = _read_private(path)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as e:
            if isinstance(e, KeyUnusable):
                raise
            raise KeyUnusable(f"cannot read {path}: {e.strerror or e}") from None
        else:
            try:
                key = bytes.fromhex(raw.decode("ascii", "replace").strip())
            except ValueError:
                key = b""
            if len(key) < 16:
                raise KeyUnusable(f"{path} holds no key; remove it to make a new one")
            return key
        _make_key(_private_dir(), path)
    raise KeyUnusable(f"cannot make {path}")


def _make_key(directory: str, path: str) -> None:
    tmp = os.path.join(directory, f".{_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(tmp, flags, 0o600)
    except OSError as e:
        raise KeyUnusable(f"cannot make a key in {directory}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(_KEY_BYTES) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # atomic, and never replaces a key another process made
        except OSError as e:
            if e.errno != errno.EEXIST:  # (the key another process made is read next)
                raise KeyUnusable(f"cannot make {path}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def signed_payload(meta: dict[str, Any], sources: Any, run_id: str, format_version: int) -> bytes:
    """The canonical encoding of what decides what replay runs or rebuilds: the program, the
    argv, working directory and ``sys.path[0]`` it ran with, the entry points and the arguments
    ``build_fn`` takes, the objects' classes, the rank, the recorded sources, the run id and the
    format version. Sorted-key, ASCII JSON: the same fields give the same bytes."""
    got = meta.get("env")
    env: dict[str, Any] = got if isinstance(got, dict) else {}
    fields = {
        "trust_version": TRUST_VERSION,
        "format_version": format_version,
        "run_id": run_id,
        "program": meta.get("program"),
        "argv": env.get("argv"),
        "cwd": env.get("cwd"),
        "sys_path0": env.get("sys_path0"),
        "entry": meta.get("entry"),
        "build_kwargs": meta.get("build_kwargs"),
        "objects": meta.get("objects"),
        "distributed": meta.get("distributed"),
        "sources": sources,
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"replay-key-id\0" + key).hexdigest()[:16]


def sign(payload: bytes, key: bytes) -> dict[str, Any]:
    """``meta/run.signature`` (docs/format.md)."""
    mac = hmac.new(key, payload, hashlib.sha256).hexdigest()
    return {"version": TRUST_VERSION, "alg": "hmac-sha256", "key": key_id(key), "mac": mac}


@dataclass(frozen=True)
class Standing:
    """Who vouches for a recording: ``"signed"`` (by this user's key), ``"trusted"`` (the user
    said ``replay trust``), or ``"foreign"`` with ``why``."""

    kind: str
    why: str = ""
    digest: str = ""

    @property
    def runs(self) -> bool:
        return self.kind != "foreign"

    def words(self) -> str:
        return {
            "signed": "signed by you",
            "trusted": "trusted by you (replay trust)",
        }.get(self.kind, f"foreign ({self.why})")


def _trusted_digests() -> set[str]:
    try:
        raw = _read_private(os.path.join(data_dir(), _STORE_FILE), _STORE_MOST)
    except OSError:
        return set()
    return {line.strip() for line in raw.decode("ascii", "replace").splitlines() if line.strip()}


def standing(meta: dict[str, Any], sources: Any, run_id: str, format_version: int) -> Standing:
    """Does this recording verify with this user's key, or did the user trust it? Never makes a
    key (reading a recording creates nothing)."""
    payload = signed_payload(meta, sources, run_id, format_version)
    digest = hashlib.sha256(payload).hexdigest()
    if digest in _trusted_digests():
        return Standing("trusted", digest=digest)
    sig = meta.get("signature")
    if not isinstance(sig, dict) or not isinstance(sig.get("mac"), str):
        return Standing("foreign", "unsigned: another tool, or a replay before signing", digest)
    try:
        key = user_key(create=False)
    except KeyUnusable as e:
        return Standing("foreign", f"your key is unusable: {e}", digest)
    if key is None:
        return Standing("foreign", "signed, but you have no key: not recorded by you", digest)
    if sig.get("key") != key_id(key):
        return Standing("foreign", "signed by another key: another user's or host's", digest)
    if not hmac.compare_digest(sign(payload, key)["mac"], sig["mac"]):
        return Standing("foreign", "its signature does not match: edited since recorded", digest)
    return Standing("signed", digest=digest)


def remember(digest: str) -> str:
    """Add ``digest`` to the trust store (made 0600); returns the store's path."""
    path = os.path.join(_private_dir(), _STORE_FILE)
    if digest in _trusted_digests():
        return path
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(digest + "\n")
    except OSError as e:
        raise KeyUnusable(f"cannot write {path}: {e.strerror or e}") from None
    _read_private(path)  # a store others can write would let them trust for you: refuse it
    return path

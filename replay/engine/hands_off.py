"""A program replay runs again changes nothing of its user's (docs/reentry.md, "What a re-run
may not touch").

Replay re-runs the recorded program up to its Recorder: in the background while the run trains
(the self-check) and in every replaying command. Whatever that start-up writes was written once
already, by the run itself, and a second time would destroy the evidence: a ``metrics.csv``
opened with ``"w"`` truncated under the training that still appends to it, a crashed run's logs
and checkpoints overwritten by its own post-mortem. So, while :func:`hands_off` is active, code
that is not replay's own (the program, and every library it calls):

- **writes no file that existed before**: an ``open`` for writing (``"w"``, ``"a"``, ``"r+"``,
  ``"x"``), ``torch.save`` or ``h5py.File(..., "w"/"a"/"r+")`` of such a path is carried out on a
  private copy in a scratch folder (the original's bytes first, for appending and updating);
  later opens of that path, reading too, see the copy. The program goes on as if it had written.
- **removes, renames or truncates no such path** (``os.remove``, ``os.rename``/``replace``,
  ``shutil.rmtree``, ``os.truncate``): refused with :class:`TouchedError`, naming the path and
  saying to put it under ``if not replay.replaying():``;
- **connects nowhere** over TCP/UDP: refused the same way (a logging service initialised twice,
  an upload);
- **leaves nothing behind**: files and folders it creates (a new log, Lightning's next
  ``version_N``) are removed when the re-run ends, and the scratch folder with them.

Opens are seen twice: ``builtins.open``/``io.open``, ``torch.save`` and ``h5py.File`` are wrapped
(they are redirected), and a Python audit hook (``sys.addaudithook``: the low-level ``os.open``,
removals, renames, connections) refuses what the wrappers did not redirect. Audit hooks see no
write made by C++ itself (``torch.save`` to a path is one, hence its wrapper) nor by a C
extension of the program's own: those stay the program's to guard with ``replay.replaying()``.

Who is writing is read from the stack: the first frame outside the standard library, torch,
numpy and h5py belongs either to replay (its sidecar, its verdict, its temporary files: let
through) or to the user's code (guarded). NB: an audit hook cannot be removed; ours is installed
once per process and does nothing while no guard is active. Not reentrant: one guard at a time.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import getpass
import io
import os
import shutil
import socket
import stat
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import PurePath
from types import FrameType
from typing import Any

from ..store.tmpdirs import private_dir

__all__ = ["hands_off", "TouchedError", "Guard", "active_guard"]

_HINT = "put it under `if not replay.replaying():` (docs/reentry.md)"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT


class TouchedError(PermissionError):
    """The re-run program tried to change a file of its user's (or to connect somewhere)."""


def _roots(names: tuple[str, ...]) -> tuple[str, ...]:
    files = (getattr(sys.modules.get(name), "__file__", None) for name in names)
    return tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in files if f)


def _install_dirs(*keys: str) -> tuple[str, ...]:
    """The folders ``sysconfig`` names under ``keys`` (``stdlib``, ``purelib``...)."""
    return tuple({os.path.abspath(p) + os.sep for k in keys if (p := sysconfig.get_paths().get(k))})


_OWN = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)
_STDLIB = _install_dirs("stdlib", "platstdlib")


def _stdlib(filename: str) -> bool:
    """A frame of the standard library's (a venv's or a system install's site-packages lies
    under the same folder, and is not)."""
    if filename.startswith("<frozen"):
        return True
    return filename.startswith(_STDLIB) and not any(
        d in filename for d in ("site-packages", "dist-packages")
    )


class Guard:
    """What one re-run has been kept from: the copies it wrote instead, what it was refused,
    and what it created (removed at the end)."""

    def __init__(self, scratch: str) -> None:
        self.scratch = scratch
        self.copies: dict[str, str] = {}  # real path -> its private copy
        self.refused: list[str] = []  # one line each
        self.created: list[str] = []  # paths the re-run made, removed at the end
        self.read: dict[str, None] = {}  # files user code opened to read (the first READ_KEPT)
        self._lib = _roots(("torch", "numpy", "h5py"))
        self.caches = _cache_roots()  # (read once: the audit hook must import nothing)
        self._lock = threading.Lock()

    # -- who is writing -----------------------------------------------------------------------
    def users_code(self, frame: FrameType | None, path: Any = None) -> bool:
        """Whether the write ``frame`` makes is user code's. Writes into torch's compile caches
        (``path`` there: ``torch.compile``'s kernels and their locks, made and replaced again
        when the re-run compiles what the run compiled) are torch's. Otherwise, from ``frame``
        outwards past the standard library's frames: a frame of replay's own says no;
        torch's, numpy's and h5py's are passed too (replay writes through them: its sidecar,
        an export); any other frame (the program, or a library it called: Lightning's logger,
        a tokenizer's cache) says yes."""
        if path is not None and (real := _real(path)) is not None and real.startswith(self.caches):
            return False
        while frame is not None:
            f = frame.f_code.co_filename
            if f.startswith(_OWN):
                return False
            if not (f.startswith(self._lib) or _stdlib(f)):
                return True
            frame = frame.f_back
        return False

    # -- what is written ----------------------------------------------------------------------
    def target(self, path: Any, *, write: bool, append: bool) -> Any:
        """Where user code opening ``path`` really goes: its private copy once it has one, a
        new copy when it writes a regular file that existed before, ``path`` otherwise (a new
        file is remembered, to be removed at the end)."""
        if isinstance(path, int) or not isinstance(path, (str, bytes, os.PathLike)):
            return path
        real = _real(path)
        if real is None:
            return path
        with self._lock:
            if real in self.copies:
                return self.copies[real]
            if not write:
                return path
            try:
                st = os.stat(real)
            except OSError:
                self.created.append(real)
                return path
            if self.made_here(real) or not stat.S_ISREG(st.st_mode):
                return path  # this re-run's, /dev/null, a FIFO, a terminal: no bytes of the user's
            copy = os.path.join(self.scratch, f"{len(self.copies)}-{os.path.basename(real)}")
            if append:
                shutil.copyfile(real, copy)
            self.copies[real] = copy
            return copy

    def refuse(self, what: str, path: Any) -> None:
        line = f"the program {what} {_show(path)}, which existed before replay ran it"
        self.refused.append(line)
        raise TouchedError(
            errno.EACCES, f"replay: {line}; replay changes no file of yours: {_HINT}"
        )

    def existed(self, path: Any) -> bool:
        """Whether ``path`` is one of the user's (it existed before and is no copy or creation
        of this re-run)."""
        real = _real(path)
        return real is not None and not self.made_here(real) and os.path.lexists(real)

    def made_here(self, real: str) -> bool:
        """Whether ``real`` is this re-run's: its copy, something it created, or anything in a
        folder it created (a compiler it started fills a temporary folder unseen)."""
        if real.startswith(self.scratch + os.sep):
            return True
        made = set(self.created)
        return any(str(p) in made for p in (PurePath(real), *PurePath(real).parents))

    def note_read(self, path: Any) -> None:
        """A file user code opened to read, kept by name: not code (an import's ``.py``), nor
        anything of Python's, the libraries' or replay's own."""
        if len(self.read) >= READ_KEPT or not isinstance(path, (str, bytes, os.PathLike)):
            return
        try:
            name = os.path.abspath(os.fsdecode(os.fspath(path)))
        except (TypeError, ValueError, OSError):
            return
        if not name.endswith(_CODE) and not name.startswith(_NOT_DATA):
            self.read.setdefault(name, None)

    def read_since(self, t: float) -> list[tuple[str, float]]:
        """The files user code read here, regular and not this re-run's own, that changed after
        ``t`` (a time.time()): ``(path, mtime)``, oldest change first. A program that resumes
        from its own checkpoint at start-up reads the one the run wrote after it began."""
        out = []
        for path in list(self.read):
            real = _real(path)
            if real is None or self.made_here(real) or real in self.copies:
                continue
            try:
                st = os.stat(real)
            except OSError:
                continue
            m = st.st_mtime  # (a file system keeping whole seconds truncates it)
            if stat.S_ISREG(st.st_mode) and (m > t or (m == int(m) and m >= int(t))):
                out.append((path, m))
        return sorted(out, key=lambda r: r[1])

    # -- the end ------------------------------------------------------------------------------
    def clean_up(self) -> None:
        """Remove what the re-run created (a folder whole: nothing in it existed before) and the
        scratch folder."""
        for path in sorted(set(self.created), key=len, reverse=True):
            if os.path.isdir(path) and not os.path.islink(path):
                # nothing in it existed before the re-run made it (a compiler's files too)
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        shutil.rmtree(self.scratch, ignore_errors=True)


def _cache_roots() -> tuple[str, ...]:
    """torch's compile caches: inductor's (``TORCHINDUCTOR_CACHE_DIR``, else
    ``/tmp/torchinductor_<user>``) and Triton's (``TRITON_CACHE_DIR``, else ``~/.triton``)."""
    triton = os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton")
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if inductor is None:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
        inductor = os.path.join(tempfile.gettempdir(), "torchinductor_" + user)
    return tuple(os.path.realpath(r) + os.sep for r in (triton, inductor))


def _real(path: Any) -> str | None:
    try:
        p = os.fsdecode(os.fspath(path))
    except (TypeError, ValueError):
        return None
    return os.path.realpath(p)


def _show(path: Any) -> str:
    try:
        return os.fsdecode(os.fspath(path))
    except (TypeError, ValueError):
        return repr(path)


def _mode_writes(mode: Any) -> tuple[bool, bool]:
    """(writes, keeps the old bytes) for an ``open`` mode string."""
    m = mode if isinstance(mode, str) else "r"
    writes = any(c in m for c in "wax+")
    return writes, writes and ("a" in m or "+" in m and "w" not in m)


_CODE = (".py", ".pyc", ".so", ".pth")
# Python's own files and the installed packages' (not sys.prefix: a system Python's is /usr,
# under which a program may live, /usr/src/app)
_NOT_DATA = _install_dirs("purelib", "platlib") + _OWN + _STDLIB
READ_KEPT = 256  # files read, kept by name to say later which changed (a data set's: the first)
_ACTIVE: Guard | None = None
_HOOKED = False


def active_guard() -> Guard | None:
    return _ACTIVE


def _audit(event: str, args: tuple[Any, ...]) -> None:
    g = _ACTIVE
    if g is None or event not in _EVENTS:
        return
    path = args[1] if event == "os.rename" and len(args) > 1 else args[0] if args else None
    if g.users_code(sys._getframe(1), path):
        _EVENTS[event](g, args)


def _on_open(g: Guard, args: tuple[Any, ...]) -> None:
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if isinstance(path, int) or path is None:
        return
    writes = _mode_writes(mode)[0] if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
    if not writes:
        g.note_read(path)
        return
    real = _real(path)
    if real is None or real in g.copies.values() or real.startswith(g.scratch + os.sep):
        return
    try:
        st = os.stat(real)
    except OSError:
        g.created.append(real)  # a new file: removed at the end
        return
    if stat.S_ISREG(st.st_mode) and not g.made_here(real):
        g.refuse("writes", path)


def _at(path: Any, dir_fd: Any) -> Any:
    """``path`` as seen from the folder ``dir_fd`` names (``shutil.rmtree`` removes by
    descriptor), or ``None`` when that cannot be told."""
    if not isinstance(dir_fd, int) or dir_fd < 0 or isinstance(path, int):
        return path
    try:
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fsdecode(path))
    except (OSError, TypeError, ValueError):
        return None


def _on_remove(g: Guard, args: tuple[Any, ...]) -> None:
    path = _at(args[0], args[1] if len(args) > 1 else None) if args else None
    if path is not None and g.existed(path):
        g.refuse("removes", path)


def _on_rename(g: Guard, args: tuple[Any, ...]) -> None:
    if len(args) < 2:
        return
    src = _at(args[0], args[2] if len(args) > 2 else None)
    dst = _at(args[1], args[3] if len(args) > 3 else None)
    for path in (src, dst):
        if path is not None and g.existed(path):
            g.refuse("moves", path)
    if src is not None and dst is not None and _real(src) in g.created:
        g.created.append(_real(dst) or "")  # what it made, under its new name


def _on_truncate(g: Guard, args: tuple[Any, ...]) -> None:
    if args and not isinstance(args[0], int) and g.existed(args[0]):
        g.refuse("truncates", args[0])


def _on_mkdir(g: Guard, args: tuple[Any, ...]) -> None:
    real = _real(args[0]) if args else None
    if real is not None and not os.path.lexists(real):
        g.created.append(real)


def _on_connect(g: Guard, args: tuple[Any, ...]) -> None:
    sock = args[0] if args else None
    if getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6):
        address = args[1] if len(args) > 1 else "?"
        where = ":".join(str(a) for a in address[:2]) if isinstance(address, tuple) else address
        g.refused.append(f"the program connects to {where}")
        raise TouchedError(
            errno.EACCES,
            f"replay: the program connects to {where}; replay lets a re-run connect nowhere: "
            + _HINT,
        )


_EVENTS: dict[str, Callable[[Guard, tuple[Any, ...]], None]] = {
    "open": _on_open,
    "os.remove": _on_remove,
    "os.rmdir": _on_remove,
    "shutil.rmtree": _on_remove,
    "os.rename": _on_rename,
    "os.truncate": _on_truncate,
    "os.mkdir": _on_mkdir,
    "socket.connect": _on_connect,
    "socket.sendto": _on_connect,
}


# -- the wrappers that redirect ---------------------------------------------------------------
def _wrap_open(real_open: Callable[..., Any]) -> Callable[..., Any]:
    def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:  # noqa: A001
        g = _ACTIVE
        if g is not None:
            writes, keeps = _mode_writes(mode)
            # a read, with nothing redirected yet, once READ_KEPT reads are named (a data
            # loader's thousands of files): as is
            redirect = writes or bool(g.copies)
            if (redirect or len(g.read) < READ_KEPT) and g.users_code(sys._getframe(1), file):
                if not writes:
                    g.note_read(file)
                if redirect:
                    file = g.target(file, write=writes, append=keeps)
        return real_open(file, mode, *args, **kwargs)

    open.__doc__ = real_open.__doc__
    return open


def _wrap_save(real_save: Callable[..., Any]) -> Callable[..., Any]:
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        g = _ACTIVE
        if g is not None and g.users_code(sys._getframe(1)):
            f = g.target(f, write=True, append=False)
        return real_save(obj, f, *args, **kwargs)

    save.__doc__ = real_save.__doc__
    return save


def _wrap_h5_init(real_init: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, name: Any, mode: str = "r", *args: Any, **kwargs: Any) -> None:
        g = _ACTIVE
        if g is not None and mode != "r" and g.users_code(sys._getframe(1)):
            name = g.target(name, write=True, append=mode in ("a", "r+"))
        real_init(self, name, mode, *args, **kwargs)

    return __init__


@contextlib.contextmanager
def _patched() -> Iterator[None]:
    saved: list[tuple[Any, str, Any]] = []

    def put(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    real_open = builtins.open
    wrapped = _wrap_open(real_open)
    put(builtins, "open", wrapped)
    put(io, "open", wrapped)
    torch = sys.modules.get("torch")
    if torch is not None:
        save = _wrap_save(torch.save)
        put(torch, "save", save)
        put(torch.serialization, "save", save)
    h5py = sys.modules.get("h5py")
    if h5py is not None:
        put(h5py.File, "__init__", _wrap_h5_init(h5py.File.__init__))
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


@contextlib.contextmanager
def hands_off() -> Iterator[Guard]:
    """While active, the program run again changes no file of its user's (module docstring);
    yields the :class:`Guard` (what was redirected and refused), cleaned up at exit."""
    global _ACTIVE, _HOOKED
    if _ACTIVE is not None:  # a replay inside a replay (a rank worker's own re-entry): one guard
        yield _ACTIVE
        return
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True
    guard = Guard(os.path.realpath(private_dir("scratch")))
    with _patched():
        _ACTIVE = guard
        try:
            yield guard
        finally:
            _ACTIVE = None
            guard.clean_up()

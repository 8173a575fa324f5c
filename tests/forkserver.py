"""A fork server for the suite's child Pythons: torch, numpy and h5py imported once, then one
``fork()`` per ``python script.py ...`` / ``python -m module ...`` the tests run to completion
(``conftest.run_py``), instead of a fresh interpreter that spends about 2.5 s importing torch
under coverage's tracer before it does anything.

Each child is set up as ``python`` would set up a fresh one: its own environment, working
directory, ``sys.argv``, ``sys.path`` (``sys.path[0]`` and ``PYTHONPATH`` from its environment),
standard streams (files the client reads back), signal dispositions; then coverage is started
for it as a fresh child's ``.pth`` hook would (``coverage.process_startup``, after the fork: the
server measures nothing), the program runs as ``__main__``, the interpreter's shutdown is done by
hand (non-daemon threads joined, ``atexit`` handlers run, streams flushed) and the child leaves
with ``os._exit`` and the program's exit status. A child killed by a signal reads as one.

What a forked child cannot pretend: that torch, numpy and h5py are not imported yet. Tests that
check what a command imports run a fresh interpreter (``run_py(..., fresh=True)``).

Protocol, one JSON object a line: the client writes ``{"argv", "env", "cwd", "stdin", "stdout",
"stderr"}`` (the last three are file paths); the server answers ``{"pid": N}`` when the child is
forked and ``{"status": S}`` (``os.waitpid``'s) when it ended. One request at a time.
"""

from __future__ import annotations

import json
import os
import signal
import sys

PRELOAD = (
    "numpy",
    "h5py",
    "torch",
    "torch.nn",
    "torch.optim",
    # what a program's first optimizer imports (torch.optim's step wrappers): ~2 s quiet, more
    # than torch itself, paid by every child that builds an optimizer
    "torch._dynamo",
    "torch.utils.data",
    "click",
    "coverage",
)
_COVERAGE_ENV = ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG")


def _child(req: dict) -> None:
    """In the forked child: become ``python argv...`` and never return."""
    code = 1
    try:
        os.setsid()  # its own session: a timeout kills it and whatever it started
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path, flags in (
            (0, req["stdin"], os.O_RDONLY),
            (1, req["stdout"], os.O_WRONLY | os.O_TRUNC),
            (2, req["stderr"], os.O_WRONLY | os.O_TRUNC),
        ):
            f = os.open(path, flags)
            os.dup2(f, fd)
            os.close(f)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        argv = req["argv"]
        base = [p for p in sys.path if p not in _SERVER_PATH_HEAD]
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if argv[0] == "-m":
            head = os.getcwd()
        elif argv[0] == "-c":
            head = ""
        else:
            head = os.path.dirname(os.path.abspath(argv[0]))
        sys.path[:] = [head, *extra, *base]
        import coverage

        coverage.process_startup()
        import runpy

        try:
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            elif argv[0] == "-c":
                import types

                sys.argv = ["-c", *argv[2:]]
                main = sys.modules["__main__"] = types.ModuleType("__main__")
                main.__dict__["__builtins__"] = __builtins__
                exec(compile(argv[1], "<string>", "exec"), main.__dict__)
            else:
                sys.argv = list(argv)
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt as e:
            _print_exception(e)
            code = 130
        except BaseException as e:  # noqa: BLE001 - as the interpreter does: print it, exit 1
            _print_exception(e)
            code = 1
        import threading

        threading._shutdown()  # type: ignore[attr-defined]  # as Py_Finalize does
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code & 0xFF)


def _print_exception(e: BaseException) -> None:
    """What the interpreter does with an uncaught exception: ``sys.excepthook`` (the
    program's, or one a library installed: replay's Recorder keeps the exception), which prints
    the traceback from the program's first frame (not this file's or runpy's, which a fresh
    ``python`` does not have)."""
    tb = e.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
        tb = tb.tb_next
    sys.excepthook(type(e), e.with_traceback(tb), tb)


_SERVER_PATH_HEAD: list[str] = []


def main() -> None:
    for k in _COVERAGE_ENV:
        os.environ.pop(k, None)
    global _SERVER_PATH_HEAD
    _SERVER_PATH_HEAD = [sys.path[0]] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    out = sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        print(json.dumps({"pid": pid}), file=out, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": status}), file=out, flush=True)


if __name__ == "__main__":
    main()

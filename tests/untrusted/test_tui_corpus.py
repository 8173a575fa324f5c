"""Every crafted file through the TUI (Textual pilot, the project's ``make_app``): refused with a
RecordingError before anything is drawn, or browsed through every view with nothing a terminal
would act on in any screen; a damaged part found while browsing ends the app with that error
(which ``replay tui`` turns into one line and exit 3), never a Rich traceback.

Also end to end: ``replay tui`` in a real pseudo-terminal, keys pressed, exit code read.
"""

from __future__ import annotations

import asyncio
import os
import pty
import select
import subprocess
import sys
import time

import pytest
from rich.text import Text
from textual.app import App
from textual.widgets import Static

from replay.errors import RecordingError
from replay_tui import make_app
from tests.conftest import run_env

from .test_cli_corpus import ALL_CASES

VIEWS = "12345678"
TIMEOUT = 120  # a hang detector: on a loaded 2-core machine browsing 14 steps took over 60 s


def unsafe_chars(text: str) -> list[str]:
    return sorted(
        {
            hex(ord(c))
            for c in text
            if (ord(c) < 0x20 and c not in "\n\t")
            or 0x7F <= ord(c) < 0xA0
            or 0x202A <= ord(c) <= 0x202E
            or 0xD800 <= ord(c) < 0xE000
        }
    )


async def _settle(pilot) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def _browse(app, *, back_to_first_batch: bool) -> list[str]:
    """Every view, the help, and (``back_to_first_batch``) the batch view stepped back to the
    oldest step; returns what each screen showed that a terminal would act on."""
    found: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot)
        for key in [*VIEWS, "question_mark", "question_mark"]:
            await pilot.press(key)
            await _settle(pilot)
            if app.failure is not None:
                return found
            bad = unsafe_chars(app.export_screenshot())
            if bad:
                found.append(f"view {key}: {bad}")
        if back_to_first_batch:
            await pilot.press("7")
            for _ in range(15):
                await pilot.press("left_square_bracket")
                await _settle(pilot)
                if app.failure is not None:
                    break
    return found


def test_the_screen_check_sees_raw_escapes():
    """The check below is only worth something if a raw ESC on screen shows in the export."""

    class Raw(App[None]):
        def compose(self):
            yield Static(Text("a\x1b[2Jb\x9b31m\u202ec"))

    async def run() -> list[str]:
        app = Raw()
        async with app.run_test(size=(40, 5)) as pilot:
            await pilot.pause()
            return unsafe_chars(app.export_screenshot())

    assert asyncio.run(run()) == ["0x1b", "0x202e", "0x9b"]


@pytest.mark.parametrize("name", ALL_CASES)
async def test_tui(corpus, name):
    case = corpus[name]
    if case.tui == "refused":
        with pytest.raises(RecordingError) as e:
            make_app(case.path, poll=False)
        assert case.fragment in str(e.value)
        return
    try:
        app = make_app(case.path, poll=False)
    except RecordingError:
        assert case.tui == "either", f"{name}: refused, but it should open"
        return
    fails = case.tui in ("fails", "either")
    try:
        found = await asyncio.wait_for(_browse(app, back_to_first_batch=fails), TIMEOUT)
    except RecordingError:  # run_test re-raises the failure that ended the app
        found = []
    assert not found, f"{name}: unsafe characters on screen: {found}"
    if case.tui == "opens":
        assert app.failure is None, f"{name}: {app.failure!r}"
    elif case.tui == "fails":
        assert isinstance(app.failure, RecordingError), f"{name}: {app.failure!r}"
        assert app.return_code == 3 and case.fragment in str(app.failure)
    else:
        assert app.failure is None or isinstance(app.failure, RecordingError), app.failure
    if name.startswith("sidecar_"):
        loaded = app.model.forensics is not None
        assert loaded == bool(case.notes.get("sidecar_ok")), (name, app.model.forensics_error)
    if name == "sidecar_escapes":
        assert "\\x1b]0;pwned" in (app.model.forensics.verdict.op or "")


# -- end to end: `replay tui` in a pseudo-terminal ----------------------------------------------


def _tui_in_a_pty(path: str, keys: str) -> tuple[int, str]:
    """Run ``replay tui PATH`` on a pseudo-terminal, type ``keys`` once it has drawn, and return
    its exit code and everything it wrote after leaving the alternate screen."""
    env = run_env()
    env.update(TERM="xterm-256color", COLUMNS="120", LINES="40")
    env.pop("REPLAY_TRACEBACK", None)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "replay", "tui", path],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + TIMEOUT
    drawn_at = None  # when the app switched to the alternate screen
    typed = False
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
            if drawn_at is None and b"\x1b[?1049h" in out:
                drawn_at = time.monotonic()
            if not typed and drawn_at is not None and time.monotonic() > drawn_at + 2:
                for k in keys:  # one at a time, as a person types
                    os.write(master, k.encode())
                    time.sleep(0.15)
                typed = True
        proc.wait(timeout=max(1, deadline - time.monotonic()))
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()  # (a Popen collected later, still running, failed the next test instead)
        pytest.fail(f"replay tui {path} did not exit within {TIMEOUT} s")
    finally:
        os.close(master)
    after = out.rsplit(b"\x1b[?1049l", 1)[-1]  # what was printed once the app left
    return proc.returncode, after.decode("utf-8", "replace")


@pytest.mark.slow
def test_replay_tui_exits_3_with_one_line_when_browsing_hits_a_damaged_record(corpus):
    code, after = _tui_in_a_pty(corpus["deep_manifest"].path, "7" + "[" * 14)
    assert code == 3, after
    assert "Traceback" not in after and "replay: error:" in after and "nested" in after, after


def test_replay_tui_refuses_a_fifo_before_drawing(corpus):
    code, after = _tui_in_a_pty(corpus["fifo_path"].path, "")
    assert code == 3 and "FIFO" in after and "Traceback" not in after, after

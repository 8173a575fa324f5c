"""Recordings for the report tests, made once a session by a real example run and bisected,
and a headless Chromium (Debian's ``chromium``, driven by Playwright) that fetches nothing.

``example``: ``examples/sqrt_at_zero.py`` recorded as ``tests/test_examples.py`` records it,
then ``replay bisect --json`` (its sidecar beside it, its report in ``bisect.json``);
``plain``: the same recording without the sidecar.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_py

CHROMIUM = os.environ.get("REPLAY_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts" / "report"
# Flags that keep the browser from reaching anything on its own (updates, sync, field trials).
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Example:
    traced: str  # the recording, its sidecar beside it
    plain: str  # the same recording, no sidecar
    bisect_json: str  # what `replay bisect --json` printed
    bisect: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="session")
def example(tmp_path_factory: pytest.TempPathFactory) -> Example:
    d = tmp_path_factory.mktemp("report-example")
    rec = d / "traced" / "sqrt_at_zero.h5"
    rec.parent.mkdir()
    r = run_py(str(ROOT / "examples" / "sqrt_at_zero.py"), str(rec), cwd=rec.parent, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    b = run_py("-m", "replay", "bisect", str(rec), "--json", cwd=rec.parent, timeout=300)
    assert b.returncode == 0, b.stderr[-2000:]
    (d / "bisect.json").write_text(b.stdout)
    plain = d / "plain" / "sqrt_at_zero.h5"
    plain.parent.mkdir()
    shutil.copy(rec, plain)
    return Example(str(rec), str(plain), str(d / "bisect.json"), json.loads(b.stdout))


@dataclass
class Opened:
    """A page opened in the browser: what it logged and asked for."""

    page: Any
    console: list[str]
    requests: list[str]
    errors: list[str]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium from the system's packages (never a downloaded one). One per test
    module, not per session: Playwright's sync API holds an event loop while it runs, and a
    pytest-asyncio test (the TUI's) that ran after it in the same worker would find it running."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright for Python is not installed (make setup)"
    )
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no browser at {CHROMIUM}: make setup installs Debian's chromium as root")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    """``open_page(path)``: the page at ``path`` with every request but the file itself aborted
    and recorded, every console message and page error kept."""
    contexts: list[Any] = []

    def opened(path: str, *, javascript: bool = True) -> Opened:
        ctx = browser.new_context(
            java_script_enabled=javascript, viewport={"width": 1200, "height": 900}
        )
        contexts.append(ctx)
        page = ctx.new_page()
        me = Path(path).resolve().as_uri()
        got = Opened(page, [], [], [])
        page.on("console", lambda m: got.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: got.errors.append(str(e)))
        page.on("request", lambda r: got.requests.append(r.url))

        def route(r: Any) -> None:
            if r.request.url == me:
                r.continue_()
            else:
                r.abort()

        page.route("**/*", route)
        page.goto(me)
        return got

    yield opened
    for c in contexts:
        c.close()


def artifact(name: str) -> Path:
    """Where a test keeps a screenshot (``test-artifacts/``, git-ignored)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name

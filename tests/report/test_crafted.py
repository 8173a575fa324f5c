"""Crafted recordings: ``<script>``, event handlers and ``javascript:`` URLs in every string
field a page shows (the recording's meta and sources, the sidecar's verdict, op, module,
location and shape tables). No script runs (the console and a ``window.__pwned`` marker say
so) and every string shows as text."""

from __future__ import annotations

import json
import shutil

import h5py
import pytest

from replay.report import build_page, write_report
from replay.store import open_recording
from replay.store.forensics import write_forensics
from tests.untrusted.corpus import _blob, _meta, sidecar_tables

from .conftest import artifact
from .test_escape_and_svg import Elements

# Every way into a page's script: a tag, a handler in a tag, a URL, an attribute broken out of,
# an SVG element, a CDATA end and a comment end. Without control characters: shown verbatim.
HTML_EVIL = (
    "<script>window.__pwned=1</script>"
    '<img src=x onerror="window.__pwned=2">'
    '"><svg onload="window.__pwned=3">'
    '<a href="javascript:window.__pwned=4">click</a>'
    '\'><iframe src="javascript:parent.__pwned=5"></iframe>'
    "]]>--><style>@import url(http://evil.example/x.css)</style>"
)


@pytest.fixture(scope="module")
def crafted(example, tmp_path_factory) -> str:
    """The example's recording with HTML_EVIL in every string of its meta and sources, and a
    sidecar (the real writer's) with it in every string table and the verdict."""
    d = tmp_path_factory.mktemp("report-crafted")
    p = d / ("run" + "-x" + ".h5")
    shutil.copy(example.plain, p)
    with h5py.File(p, "r+") as f:
        meta = _meta(f)
        for e in meta["entry"].values():
            e["qualname"] = "train" + HTML_EVIL
            e["module"] = "__main__" + HTML_EVIL
            e["path"] = "/x/" + HTML_EVIL + ".py"
        meta["env"].update(hostname=HTML_EVIL, torch=HTML_EVIL, argv=["t.py", HTML_EVIL])
        meta["env"]["cwd"] = HTML_EVIL
        meta["model"]["class"] = HTML_EVIL
        meta["optimizer"]["class"] = HTML_EVIL
        _blob(f, "meta/run", json.dumps(meta).encode())
        sources = json.loads(f["meta/sources"][()].tobytes())
        sources = {k: v + "\n# " + HTML_EVIL + "\n" for k, v in sources.items()}
        _blob(f, "meta/sources", json.dumps(sources).encode())
    with open_recording(p) as rec:
        run_id = rec.run_id
    tables = sidecar_tables(run_id, evil=HTML_EVIL)
    v = tables["verdict"]
    v.update(
        cause="op",
        made="NaN",
        made_from="finite",
        samples=[1],
        sample_sources=[{"index": 3, "file": HTML_EVIL}],
        sinks=["the loss" + HTML_EVIL],
        surfaced={"op": HTML_EVIL, "phase": HTML_EVIL, "module": HTML_EVIL, "how": HTML_EVIL},
        nan_from_inf={"op": HTML_EVIL, "phase": "forward", "module": "", "from": HTML_EVIL},
    )
    write_forensics(str(p).replace(".h5", ".forensics.h5"), run_id=run_id, step=10, tables=tables)
    return str(p)


def test_no_string_from_the_file_makes_an_element(crafted, example):
    html = build_page(crafted)
    seen, clean = Elements(), Elements()
    seen.feed(html)
    clean.feed(build_page(example.traced))
    assert set(seen.tags) <= set(clean.tags)  # no element the page does not make itself
    assert seen.tags.count("script") == 1 and seen.tags.count("style") == 1  # ours
    assert not {"img", "iframe", "a"} & set(seen.tags)
    assert not [a for a in seen.attrs if a.startswith("on") or a in ("href", "src")]
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html


def test_no_script_runs_and_the_strings_show_as_text(crafted, tmp_path, open_page):
    out = tmp_path / "crafted.html"
    write_report(crafted, str(out))
    got = open_page(str(out))
    page = got.page
    page.wait_for_load_state("load")
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert got.console == [] and got.errors == []  # not even a refused script or fetch
    assert got.requests == [out.resolve().as_uri()]
    text = page.locator("body").inner_text()
    # every field that carried it shows it as text: verdict op, module, sources, samples, run
    assert text.count("<script>window.__pwned=1</script>") >= 8
    assert HTML_EVIL in page.locator("#culprit-op").inner_text()
    assert HTML_EVIL in page.locator("#samples").inner_text()
    # the page's own script still runs (its hash is allowed): it added the filter box
    assert page.locator("#ops-filter").count() == 1
    page.screenshot(path=str(artifact("crafted.png")), full_page=True)

"""Unit tests of the page's escaping and of the plots drawn from Python."""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser

import numpy as np

from replay.report.assets import SCRIPT
from replay.report.escape import esc, esc_code, script_hash
from replay.report.page import csp
from replay.report.svg import MAX_POINTS, Mark, color_of, heat_map, line_plot, reduce_points

EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">\'&'


class Elements(HTMLParser):
    """The tags and attributes an HTML parser sees in a fragment."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [k for k, _ in attrs]


def parsed(fragment: str) -> Elements:
    p = Elements()
    p.feed(fragment)
    return p


def test_esc_leaves_no_tag_and_no_attribute():
    p = parsed(f'<p title="{esc(EVIL)}">{esc(EVIL)}</p>')
    assert p.tags == ["p"] and p.attrs == ["title"]
    assert esc("a'b\"c") == "a&#x27;b&quot;c"


def test_esc_shows_control_and_bidi_characters_and_survives_a_lone_surrogate():
    s = esc("a\x1b[2J\u202eb\ud800\nc")
    assert "\x1b" not in s and "\u202e" not in s and "\n" not in s
    s.encode("utf-8")  # a lone surrogate would fail here
    assert esc_code("x\ny<") == "x\ny&lt;"


def test_script_hash_is_the_csp_hash_of_the_script():
    want = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    assert script_hash(SCRIPT) == f"'sha256-{want}'"
    assert f"script-src 'sha256-{want}'" in csp()
    assert csp().startswith("default-src 'none'; img-src data:; style-src 'unsafe-inline'")


def test_reduce_points_keeps_a_spike_among_ten_thousand_steps():
    y = np.ones(10_000)
    y[7_777] = 1e6
    y[100] = np.nan
    idx = reduce_points(y)
    assert len(idx) <= MAX_POINTS and 7_777 in idx and 100 not in idx
    assert (np.diff(idx) > 0).all()


def test_line_plot_marks_the_first_bad_step_the_window_and_nonfinite_steps():
    steps = np.arange(50)
    y = np.linspace(1, 2, 50)
    y[40:] = np.nan
    svg = line_plot(
        steps,
        y,
        title="loss",
        marks=[Mark(40, "first bad step 40", "bad")],
        window=(10, 45),
        bad=np.arange(50) >= 40,
    )
    assert '<g class="mark bad" data-step="40">' in svg
    assert "first bad step 40" in svg
    assert "replayable: steps 10..45" in svg
    assert "NaN/Inf from step 40 (10 steps)" in svg
    # a gap at the NaN: the finite points are one polyline, none drawn at NaN
    assert svg.count("<polyline") == 1 and "nan" not in svg.split("<polyline")[1].split("/>")[0]


def test_line_plot_escapes_its_labels_and_handles_no_finite_value():
    svg = line_plot(np.arange(3), np.full(3, np.nan), title=EVIL, marks=[Mark(1, EVIL, "bad")])
    assert "<script" not in svg and "<img" not in svg
    assert "no finite values" in svg
    assert "no steps" in line_plot(np.zeros(0), np.zeros(0), title="x")


def test_line_plot_log_axis_labels_are_the_values():
    svg = line_plot(np.arange(3), np.array([1e-3, 1.0, 1e3]), title="g", log=True)
    labels = re.findall(r'<text class="axis" [^>]*>([^<]+)</text>', svg)
    assert labels == ["1000", "0.001"]


def test_heat_map_colours_by_log_value_and_marks_nonfinite_cells():
    values = np.array([[1e-3, 1e-1, np.inf], [np.nan, 1.0, 10.0]])
    svg = heat_map(["a", EVIL], np.array([0, 1, 2]), values, title="grad")
    assert "<script" not in svg
    assert svg.count("<rect") == 5  # the NaN cell (nothing measured) is left out
    assert 'class="bad"' in svg
    assert color_of(0.0) == "#440154" and color_of(1.0) == "#fde725"
    assert f'fill="{color_of(0.0)}"' in svg and f'fill="{color_of(1.0)}"' in svg


def test_a_map_of_zeros_says_zero_is_black_not_a_made_up_range():
    # Regression: every update ratio 0 (a warmup at lr 0 between the only two snapshots) drew
    # black cells under "(log10: 1 dark .. 10 yellow)", and the line plot said "no finite values".
    svg = heat_map(["w"], np.array([2]), np.zeros((1, 1)), title="ratio")
    assert "(0 black)" in svg and "yellow" not in svg
    mixed = heat_map(["w", "v"], np.array([2, 3]), np.array([[1.0, 10.0], [0.0, 1.0]]), title="r")
    assert "(log10: 1 dark .. 10 yellow, 0 black)" in mixed
    plot = line_plot(np.array([2, 3]), np.zeros(2), title="ratio", log=True)
    assert "every value is 0: nothing to draw on a log scale" in plot


def test_heat_map_buckets_many_steps_keeping_an_infinity():
    values = np.ones((1, 10_000))
    values[0, 5_000] = np.inf
    svg = heat_map(["w"], np.arange(10_000), values, title="g")
    assert svg.count("<rect") == 300 and svg.count('class="bad"') == 1
    assert heat_map([], np.zeros(0), np.zeros((0, 0)), title="g") == ""

"""The op detail of a culprit that a custom ``autograd.Function``'s backward ran: the backward
line under the forward one, as ``replay bisect`` prints it ("ran at"); nothing more for an op
of autograd's own formulas."""

from __future__ import annotations

from textual.app import App, ComposeResult

from replay.reports import TraceVerdict
from replay.reports.verdict import SourceLine
from tui.widgets.op_detail import OpDetail

FORWARD: SourceLine = {
    "file": "/r/train.py",
    "line": 25,
    "function": "forward",
    "code": "GradReverse.apply(f)",
}
BACKWARD: SourceLine = {
    "file": "/r/train.py",
    "line": 15,
    "function": "backward",
    "code": "return -g / s, None",
}
ROW = {
    "index": 5,
    "op": "aten::div",
    "phase": "backward",
    "status": "producer",
    "module": "",
    "inputs": "float32[8,3]",
    "outputs": "float32[8,3]",
    "stats": {},
    "hist": [],
    "mem_bytes": 0,
    "source": "/r/train.py:25:forward",
}


class _Host(App[None]):
    def compose(self) -> ComposeResult:
        yield OpDetail(id="detail")


async def _shown(executed_at: SourceLine | None) -> str:
    verdict = TraceVerdict(
        step=3, kind="nonfinite", cause="op", op_index=5, op="aten::div", phase="backward",
        source=FORWARD, executed_at=executed_at,
    )  # fmt: skip
    app = _Host()
    async with app.run_test(size=(100, 30)) as pilot:
        detail = app.query_one(OpDetail)
        detail.show(ROW, {"/r/train.py": {25: "GradReverse.apply(f)"}}, "/r", verdict)
        await pilot.pause()
        return str(detail.render())


async def test_a_custom_functions_backward_line_is_shown_under_the_forward_one() -> None:
    text = await _shown(BACKWARD)
    assert "source   train.py:25 in forward" in text
    assert "ran at   train.py:15 in backward" in text and "return -g / s, None" in text


async def test_an_op_of_autograds_own_formulas_shows_its_forward_line_only() -> None:
    assert "ran at" not in await _shown(None)

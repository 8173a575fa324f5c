"""``OpList``: the op timeline of a step, virtualised on Textual's line API.

A step can hold hundreds of thousands of ops, so rows are never widgets: ``render_line`` draws
only the visible lines from blocks of rows read lazily (``ops_columns(start, stop)``) in thread
workers and kept in a small cache. A row whose block is not read yet shows as ``…`` and is
redrawn when the block arrives.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

__all__ = ["OpList", "STATUS_GLYPHS", "PHASE_SHORT", "BLOCK"]

BLOCK = 4096  # rows per read; the sidecar's chunk size
CACHE_BLOCKS = 48
LIST_COLUMNS = ("phase", "name", "module", "status", "outputs")
PHASE_SHORT = (("fw", "green"), ("bw", "cyan"), ("opt", "magenta"), ("oth", "white"))
STATUS_GLYPHS = (
    ("·", "dim"),  # finite
    ("●", "bold red"),  # producer: the culprit
    ("○", "yellow"),  # propagator
    ("✖", "bold magenta"),  # raised
    ("◌", "blue"),  # non-finite but exempt
)


class OpList(ScrollView, can_focus=True):
    """Rows are op indices (``rows``: all ops, or a filtered subset); ``cursor`` is a row.

    Posts :class:`OpList.Selected` whenever the op under the cursor changes.
    """

    BINDINGS = [
        Binding("up,k", "move(-1)", "op ↑", show=False),
        Binding("down,j", "move(1)", "op ↓", show=False),
        Binding("pageup", "page(-1)", "page ↑", show=False),
        Binding("pagedown,space", "page(1)", "page ↓", show=False),
        Binding("home,g", "edge(0)", "first op", show=False),
        Binding("end,G", "edge(1)", "last op", show=False),
    ]
    COMPONENT_CLASSES = {"oplist--cursor"}
    DEFAULT_CSS = """
    OpList { height: 1fr; }
    OpList > .oplist--cursor { background: $accent 40%; text-style: bold; }
    OpList:focus > .oplist--cursor { background: $accent; }
    """

    cursor: reactive[int] = reactive(0, always_update=True)

    class Selected(Message):
        def __init__(self, op_index: int) -> None:
            super().__init__()
            self.op_index = op_index

    def __init__(self, reader: Any, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.reader = reader
        self.n_ops = int(reader.n_ops)
        self.rows: np.ndarray = np.arange(self.n_ops, dtype=np.int64)
        self._blocks: dict[int, dict[str, np.ndarray]] = {}
        self._pending: set[int] = set()
        self._names = reader.strings("ops")
        self._modules = reader.strings("modules")
        self._shapes = reader.strings("shapes")
        self.virtual_size = Size(self._line_width(), len(self.rows))

    # -- data ------------------------------------------------------------------------------------

    @property
    def op_index(self) -> int | None:
        """The op under the cursor (``None`` when the filter left no rows)."""
        return int(self.rows[self.cursor]) if len(self.rows) else None

    def set_rows(self, rows: np.ndarray) -> None:
        """Show ``rows`` (op indices, ascending); keeps the cursor on the same op or the next."""
        current = self.op_index
        self.rows = rows
        self.virtual_size = Size(self._line_width(), len(rows))
        if len(rows) and current is not None:
            self.cursor = min(int(np.searchsorted(rows, current)), len(rows) - 1)
        else:
            self.cursor = 0
        self.refresh()

    def select_op(self, op_index: int) -> bool:
        """Move to ``op_index`` (centred); False when the current rows do not contain it."""
        i = int(np.searchsorted(self.rows, op_index))
        if i >= len(self.rows) or self.rows[i] != op_index:
            return False
        self.cursor = i
        self.scroll_to(y=max(0, i - self.scrollable_content_region.height // 2), animate=False)
        return True

    def _row(self, op: int) -> dict[str, Any] | None:
        block = op // BLOCK
        cols = self._blocks.get(block)
        if cols is None:
            if block not in self._pending:
                self._pending.add(block)
                self._load_block(block)
            return None
        j = op - block * BLOCK
        return {k: v[j] for k, v in cols.items()}

    @work(thread=True)
    def _load_block(self, block: int) -> None:
        cols = self.reader.ops_columns(block * BLOCK, (block + 1) * BLOCK, LIST_COLUMNS)
        self.app.call_from_thread(self._block_loaded, block, cols)

    def _block_loaded(self, block: int, cols: dict[str, np.ndarray]) -> None:
        self._blocks[block] = cols
        self._pending.discard(block)
        while len(self._blocks) > CACHE_BLOCKS:
            self._blocks.pop(next(iter(self._blocks)))
        self.refresh()

    @property
    def loaded(self) -> bool:
        """True when every visible row is drawn from data (nothing shows ``…``)."""
        top = int(self.scroll_offset.y)
        visible = self.rows[top : top + max(1, self.size.height)]
        return all(int(op) // BLOCK in self._blocks for op in visible)

    # -- drawing ---------------------------------------------------------------------------------

    def _line_width(self) -> int:
        return max(40, self.size.width)

    def _widths(self) -> tuple[int, int, int]:
        width = max(40, self.size.width)
        digits = max(4, len(str(self.n_ops)))
        rest = width - (digits + 1) - 4 - 2  # index, phase, glyph
        op_w = max(14, min(28, rest * 4 // 10))
        mod_w = max(8, min(30, (rest - op_w) // 2))
        return digits, op_w, mod_w

    def render_line(self, y: int) -> Strip:
        row = int(self.scroll_offset.y) + y
        width = self.size.width
        if row >= len(self.rows):
            return Strip.blank(width)
        op = int(self.rows[row])
        digits, op_w, mod_w = self._widths()
        text = Text(no_wrap=True, overflow="crop")
        text.append(f"{op:>{digits}} ", style="dim")
        r = self._row(op)
        if r is None:
            text.append("…", style="dim")
        else:
            phase, pstyle = PHASE_SHORT[min(int(r["phase"]), 3)]
            glyph, gstyle = STATUS_GLYPHS[min(int(r["status"]), 4)]
            name = self._names[int(r["name"])] if r["name"] >= 0 else "?"
            name = name.removeprefix("aten::")
            mod = self._modules[int(r["module"])] if r["module"] >= 0 else ""
            shape = self._shapes[int(r["outputs"])] if r["outputs"] >= 0 else ""
            text.append(f"{phase:<3} ", style=pstyle)
            text.append(f"{glyph} ", style=gstyle)
            nstyle = gstyle if int(r["status"]) else ""
            text.append(f"{name[:op_w]:<{op_w}} ", style=nstyle)
            text.append(f"{_tail(mod, mod_w):<{mod_w}} ", style="blue" if mod else "dim")
            text.append(shape.split("@")[0], style="dim")
        segments = list(text.render(self.app.console, end=""))
        strip = Strip(segments).crop_extend(0, width, None)
        if row == self.cursor:
            strip = strip.apply_style(self.get_component_rich_style("oplist--cursor"))
        return strip

    # -- moving ----------------------------------------------------------------------------------

    def watch_cursor(self, old: int, new: int) -> None:
        height = self.scrollable_content_region.height
        top = int(self.scroll_offset.y)
        if new < top:
            self.scroll_to(y=new, animate=False)
        elif height and new >= top + height:
            self.scroll_to(y=new - height + 1, animate=False)
        else:  # no scroll: repaint the two rows that changed, not the whole list
            width = self.size.width
            self.refresh(Region(0, old - top, width, 1), Region(0, new - top, width, 1))
        if len(self.rows):
            self.post_message(self.Selected(int(self.rows[new])))

    def action_move(self, delta: int) -> None:
        if len(self.rows):
            self.cursor = max(0, min(len(self.rows) - 1, self.cursor + delta))

    def action_page(self, direction: int) -> None:
        self.action_move(direction * max(1, self.scrollable_content_region.height - 1))

    def action_edge(self, end: int) -> None:
        if len(self.rows):
            self.cursor = len(self.rows) - 1 if end else 0

    def on_resize(self) -> None:
        self.virtual_size = Size(self._line_width(), len(self.rows))

    def on_click(self, event: Any) -> None:
        row = int(self.scroll_offset.y) + event.y
        if 0 <= row < len(self.rows):
            self.cursor = row


def _tail(s: str, n: int) -> str:
    return s if len(s) <= n else "…" + s[-(n - 1) :]

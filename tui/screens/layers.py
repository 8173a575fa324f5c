"""Layers: the module tree with per-module activation statistics; the culprit's module is
highlighted and unfolded; choosing a module shows its ops."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from ..messages import ModuleChosen
from ..model import RunModel, SafeForensics
from ..widgets.plot import fmt_num
from .base import ForensicsScreen

__all__ = ["LayersScreen", "module_label"]


def module_label(row: dict[str, Any], culprit: bool) -> Text:
    name = row["name"] or "(root)"
    short = name.rsplit(".", 1)[-1]
    t = Text()
    t.append(short, style="bold red reverse" if culprit else "bold")
    t.append(f" {row.get('kind') or ''}", style="dim")
    if not np.isfinite(row["act_nonfinite"]):  # never called (a ModuleList): no output to show
        t.append("  not called", style="dim")
    else:
        t.append(f"  mean {fmt_num(row['act_mean'])} std {fmt_num(row['act_std'])}")
        t.append(f" |max| {fmt_num(row['act_absmax'])}")
        zf = row["act_zero_frac"]
        if np.isfinite(zf):
            t.append(f" zero {zf:.0%}", style="yellow" if zf > 0.5 else "")
        if row["act_nonfinite"] > 0:
            t.append(f"  {int(row['act_nonfinite'])} NaN/Inf", style="bold red")
    t.append(f"  {row['n_ops']} ops", style="dim")
    return t


class LayersScreen(ForensicsScreen):
    BODY_ID = "layers-body"
    TITLE_SUFFIX = "layers"
    BINDINGS = [
        Binding("o", "show_ops", "ops of module"),
        Binding("c", "culprit", "culprit module"),
        Binding("e", "expand_all", "expand all"),
        Binding("E", "collapse_all", "collapse all", show=False),
    ]
    DEFAULT_CSS = "LayersScreen Tree { height: 1fr; }"

    def __init__(self, model: RunModel) -> None:
        super().__init__(model)
        self.culprit_node: TreeNode[str] | None = None

    async def build_body(self, body: Vertical, reader: SafeForensics) -> None:
        rows = reader.modules()
        culprit = reader.verdict.module
        tree: Tree[str] = Tree("model", id="module-tree")
        tree.show_root = False
        nodes: dict[int, TreeNode[str]] = {}
        for i, row in enumerate(rows):
            parent = nodes.get(row["parent"], tree.root)
            is_culprit = culprit is not None and row["name"] == culprit
            nodes[i] = node = parent.add(module_label(row, is_culprit), data=row["name"] or "")
            if is_culprit:
                self.culprit_node = node
        for node in nodes.values():
            if not node.children:
                node.allow_expand = False
        tree.root.expand()
        for node in list(nodes.values())[:1]:
            node.expand()
        await body.mount(tree)
        self.call_after_refresh(self.action_culprit)

    def action_culprit(self) -> None:
        tree = next(iter(self.query(Tree).results(Tree)), None)
        if tree is None:
            return
        tree.focus()
        node = self.culprit_node
        if node is None:
            return
        parent = node.parent
        while parent is not None:
            parent.expand()
            parent = parent.parent
        self.call_after_refresh(tree.move_cursor, node)

    def action_show_ops(self) -> None:
        tree = next(iter(self.query(Tree).results(Tree)), None)
        node = tree.cursor_node if tree is not None else None
        if node is not None and node.data is not None:
            self.post_message(ModuleChosen(node.data))

    @on(Tree.NodeSelected)
    def _selected(self, event: Tree.NodeSelected[str]) -> None:
        event.stop()
        if not event.node.children and event.node.data is not None:
            self.post_message(ModuleChosen(event.node.data))

    def action_expand_all(self) -> None:
        for tree in self.query(Tree):
            tree.root.expand_all()

    def action_collapse_all(self) -> None:
        for tree in self.query(Tree):
            for child in tree.root.children:
                child.collapse_all()

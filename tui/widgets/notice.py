"""``NoForensics``: what a forensics view shows before ``replay bisect`` has written its sidecar."""

from __future__ import annotations

from textual.widgets import Static

__all__ = ["NoForensics"]


class NoForensics(Static):
    DEFAULT_CSS = """
    NoForensics { width: 1fr; height: auto; margin: 2 4; padding: 1 2; border: round $warning;
                  color: $warning; }
    """

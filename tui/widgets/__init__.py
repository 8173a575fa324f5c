"""Widgets of the replay TUI, one module each."""

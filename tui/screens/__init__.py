"""Screens of the replay TUI, one module each (``.tcss`` beside them)."""

"""Recording: capture on the training thread, encode and write on a background thread."""

from .recorder import Recorder

__all__ = ["Recorder"]

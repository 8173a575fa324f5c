"""The replay engine: rebuild the objects from the recorded entry points, restore a snapshot,
re-run recorded steps with their RNG states, hyper-parameters, modes and batches, and measure
each step exactly as the recorder did (imports torch)."""

from .engine import Engine

__all__ = ["Engine"]

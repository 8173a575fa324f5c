"""The HDF5 store: layout, ring buffers, writing and reading. Imports numpy and h5py, never torch."""

from .layout import FORMAT_NAME, FORMAT_VERSION, HEALTH_COLUMNS
from .reader import Recording, Window, open_recording, sidecar_path
from .tree import Opaque, TensorLeaf, decode, encode

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "HEALTH_COLUMNS",
    "Recording",
    "Window",
    "open_recording",
    "sidecar_path",
    "Opaque",
    "TensorLeaf",
    "encode",
    "decode",
]

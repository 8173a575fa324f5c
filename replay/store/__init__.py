"""The HDF5 store: layout, ring buffers, writing and reading. Imports numpy and h5py, never torch.

The reader's names are imported when first asked for (``__getattr__``): the recorder imports
store modules (the tree, the writer) in the training process, which never loads the reader."""

from typing import TYPE_CHECKING, Any

from .layout import FORMAT_NAME, FORMAT_VERSION, HEALTH_COLUMNS
from .tree import Opaque, TensorLeaf, decode, encode

if TYPE_CHECKING:
    from .reader import Recording, Window, open_recording, sidecar_path

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


def __getattr__(name: str) -> Any:
    if name in ("Recording", "Window", "open_recording", "sidecar_path"):
        from . import reader

        return getattr(reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

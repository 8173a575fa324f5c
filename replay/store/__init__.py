"""The HDF5 store: layout, ring buffers, writing and reading. Imports numpy and h5py, never torch.

The reader's names are imported when first asked for (``__getattr__``): the recorder imports
store modules (the tree, the writer) in the training process, which never loads the reader."""

from typing import TYPE_CHECKING, Any

from .layout import FORMAT_VERSION, HEALTH_COLUMNS
from .tree import TensorLeaf

if TYPE_CHECKING:
    from .reader import Recording, open_recording

__all__ = ["FORMAT_VERSION", "HEALTH_COLUMNS", "Recording", "open_recording", "TensorLeaf"]


def __getattr__(name: str) -> Any:
    if name in ("Recording", "open_recording"):
        from . import reader

        return getattr(reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

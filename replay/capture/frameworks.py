"""State that framework objects keep outside any ``state_dict`` (docs/reentry.md).

A named object a run hands the Recorder may be a framework's driver rather than a stateful
object: accelerate's ``Accelerator`` counts micro-batches to decide when ``accumulate()``
synchronises and the optimizer really steps; Lightning Fabric's precision plugin holds the
GradScaler under ``16-mixed``. Left alone, a replay from a snapshot starts that counter at the
re-run program's value and steps the optimizer on the wrong micro-batches. :func:`state_view`
gives such an object a ``state_dict``/``load_state_dict`` pair that snapshots keep like any
other named object's. Imports no framework: objects are recognised by their class's module.
"""

from __future__ import annotations

from typing import Any

from .generators import generator_view

__all__ = ["state_view"]


class _HiddenState:
    """A framework driver's state as a ``state_dict``: accelerate's ``Accelerator``, its
    micro-batch counter (``step``) and its GradScaler; Lightning Fabric, the GradScaler its
    precision plugin (``_precision``) drives under ``16-mixed``."""

    def __init__(self, obj: Any, counted: bool, holder: str | None = None) -> None:
        self.obj, self._counted, self._holder = obj, counted, holder

    def _scaler(self) -> Any:
        owner = self.obj if self._holder is None else getattr(self.obj, self._holder, None)
        s = getattr(owner, "scaler", None)
        return s if callable(getattr(s, "state_dict", None)) else None

    def state_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": int(getattr(self.obj, "step", 0))} if self._counted else {}
        scaler = self._scaler()
        if scaler is not None:
            d["scaler"] = scaler.state_dict()
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if self._counted:
            self.obj.step = int(d.get("step", 0))
        scaler = self._scaler()
        if scaler is not None and d.get("scaler"):
            scaler.load_state_dict(d["scaler"])


def state_view(obj: Any) -> Any:
    """A ``state_dict``/``load_state_dict`` view of ``obj``'s hidden state, or ``None`` for an
    object that has none we know of."""
    cls = type(obj)
    module, name = cls.__module__, cls.__name__
    if module.startswith("accelerate.") and name == "Accelerator":
        return _HiddenState(obj, counted=True)
    if module.startswith(("lightning.fabric.", "lightning_fabric.")) and name == "Fabric":
        return _HiddenState(obj, counted=False, holder="_precision")
    return generator_view(obj)  # a random generator of the program's own

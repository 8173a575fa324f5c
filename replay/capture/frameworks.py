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

__all__ = ["state_view"]


def _scaler(obj: Any) -> Any:
    s = getattr(obj, "scaler", None)
    return s if callable(getattr(s, "state_dict", None)) else None


class AcceleratorState:
    """accelerate's ``Accelerator``: its micro-batch counter (``step``) and its GradScaler."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator

    def state_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": int(getattr(self.accelerator, "step", 0))}
        scaler = _scaler(self.accelerator)
        if scaler is not None:
            d["scaler"] = scaler.state_dict()
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.accelerator.step = int(d.get("step", 0))
        scaler = _scaler(self.accelerator)
        if scaler is not None and d.get("scaler"):
            scaler.load_state_dict(d["scaler"])


class FabricState:
    """Lightning Fabric: the GradScaler its precision plugin drives under ``16-mixed``."""

    def __init__(self, fabric: Any) -> None:
        self.fabric = fabric

    def _plugin_scaler(self) -> Any:
        return _scaler(getattr(self.fabric, "_precision", None))

    def state_dict(self) -> dict[str, Any]:
        scaler = self._plugin_scaler()
        return {"scaler": scaler.state_dict()} if scaler is not None else {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        scaler = self._plugin_scaler()
        if scaler is not None and d.get("scaler"):
            scaler.load_state_dict(d["scaler"])


def state_view(obj: Any) -> Any:
    """A ``state_dict``/``load_state_dict`` view of ``obj``'s hidden state, or ``None`` for an
    object that has none we know of."""
    cls = type(obj)
    module, name = cls.__module__, cls.__name__
    if module.startswith("accelerate.") and name == "Accelerator":
        return AcceleratorState(obj)
    if module.startswith(("lightning.fabric.", "lightning_fabric.")) and name == "Fabric":
        return FabricState(obj)
    return None

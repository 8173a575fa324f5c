"""Judgements shared by ``replay doctor`` and the TUI, one place each (no imports: the TUI
reads them without torch).

``UPDATE_RATIO_BAND``: the healthy range of an update-to-weight ratio (how much a step changes a
weight tensor, relative to its norm); about 1e-3 is typical, and outside this band a learning
rate is far too small or too large.

``VANISHING_GRAD_NORM``: a gradient norm below it is essentially zero, nothing reaches the
parameters (doctor's ``grad_norm_vanishing`` on the run's global norm, the TUI's "vanishing" mark
on one parameter's).
"""

from __future__ import annotations

__all__ = ["UPDATE_RATIO_BAND", "VANISHING_GRAD_NORM"]

UPDATE_RATIO_BAND = (1e-5, 5e-2)
VANISHING_GRAD_NORM = 1e-7

"""The layers view's one line per module."""

from __future__ import annotations

import math

from replay_tui.screens.layers import module_label


def _row(name, kind, mean, std, absmax, zero, nonfinite, n_ops):
    return {
        "name": name,
        "kind": kind,
        "act_mean": mean,
        "act_std": std,
        "act_absmax": absmax,
        "act_zero_frac": zero,
        "act_nonfinite": nonfinite,
        "n_ops": n_ops,
    }


def test_a_container_that_is_never_called_says_so_instead_of_nan_statistics():
    nan = math.nan
    text = module_label(_row("h", "ModuleList", nan, nan, nan, nan, nan, 0), culprit=False).plain
    assert text == "h ModuleList  not called  0 ops"


def test_a_module_whose_output_is_all_nan_still_shows_its_count():
    nan = math.nan
    row = _row("h.0.ln_2", "LayerNorm", nan, nan, nan, 0.0, 672.0, 3)
    text = module_label(row, culprit=True).plain
    assert text.startswith("ln_2 LayerNorm  mean nan std nan |max| nan zero 0%")
    assert "672 NaN/Inf" in text and "not called" not in text

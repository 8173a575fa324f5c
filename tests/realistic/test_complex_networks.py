"""Networks with complex tensors (fourier_operator.py: an FNO's spectral layers, ``cfloat``
weights, ``rfft``/``irfft``).

Was: the tracer checked only floating-point tensors, so a spectral layer whose complex product
overflowed was blamed on the ``irfft`` downstream that carried the overflow into a real
tensor, "made NaN from finite inputs" (a complex input was never looked at), and the weight
statistics cast the complex weights to real with torch's warning in the user's output.
"""

from __future__ import annotations

from tests.realistic.test_real_programs import bisect_json, record


def test_an_fno_whose_spectral_weights_blow_up_is_bisected_to_the_complex_einsum(
    tmp_path, elsewhere
):
    run, p = record(tmp_path, "fourier_operator.py", "run.h5", "--lr", "1e4")
    assert p.returncode != 0 and "loss is nan at step 2" in p.stderr, p.stderr[-2000:]
    d = bisect_json(run, elsewhere)
    assert (d["first_bad_step"], d["cause"]) == (2, "op"), d["notes"]
    assert (d["op"], d["phase"], d["module"]) == ("aten::bmm", "forward", "spectral.0"), d["op"]
    assert "einsum" in d["source"]["code"] and d["made_from"] == "finite"
    assert d["reproducible"] is True  # its complex weights replayed bitwise

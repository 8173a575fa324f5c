"""Every command reads a recording whose per-step values are what frameworks pass (issue 44,
item 3): Lightning's RNG-state tensors, Hugging Face's 0-dim tensors, numpy scalars and arrays,
nested dicts and tuples, a step returning ``(loss, metrics)`` with tensors in the metrics.
``replay export`` died writing skip.json ("Object of type Tensor is not JSON serializable",
exit 6); no command may."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from replay.jsonsafe import json_safe
from tests.conftest import SCRIPTS, replay_cli, run_env, run_py


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("framework-values") / "run.h5"
    p = run_py(str(SCRIPTS / "framework_values.py"), str(out), env=run_env(SCRIPTS))
    assert "loss is nan at step 8" in p.stdout, p.stderr[-2000:]
    return out


def _json(*args: str) -> tuple[int, dict]:
    p = replay_cli(*args, "--json", env=run_env(SCRIPTS), timeout=120)
    assert "internal error" not in p.stdout + p.stderr, p.stdout[-2000:] + p.stderr[-2000:]
    return p.returncode, json.loads(p.stdout)


def test_export_writes_tensor_and_numpy_values_into_skip_json(run, tmp_path):
    rc, d = _json("export", str(run), "--out", str(tmp_path / "ck"))
    assert rc == 0, d
    skip = json.loads((tmp_path / "ck" / "skip.json").read_text())
    assert skip["first_bad"] == 8
    assert skip["skip"][0]["values"] == {
        "num_items_in_batch": 16,
        "micro_rng": ["tensor uint8[5056]"],  # too large to write: summarised
        "epoch": 2,
        "scale": 1.0,
        "weights": [0.25, 0.75],
        "logged": {"ema": [0.5, 1.5], "inner": {"n": 8}},
        "pair": [1.0, "a"],
    }
    assert d["skip"] == skip["skip"]


def test_whatif_trace_and_doctor_read_tensor_and_numpy_values(run):
    rc, w = _json("whatif", str(run), "--scale", "lr=0.1")
    assert rc == 1 and w["baseline_failure"] == 8, w  # no change removes the NaN input
    rc, t = _json("trace", str(run), "--step", "8")
    assert rc == 0 and t["step"] == 8, t
    rc, doc = _json("doctor", str(run))
    assert rc == 0 and doc[0]["rule"] == "nonfinite_recorded", doc


def test_json_safe_writes_tensors_numpy_and_nesting_as_json():
    value = {
        "zero_dim": torch.tensor(2.5),
        "grad": torch.tensor(1.0, requires_grad=True) * 3,
        "small": torch.tensor([1.0, float("nan")]),
        "large": torch.zeros(3, 4, 5),
        "np_scalar": np.float32(0.5),
        "np_int": np.int64(7),
        "np_inf": np.float64("inf"),
        "np_array": np.array([[1, 2]]),
        "big_array": np.zeros((100,), dtype=np.float16),
        "nested": ({"t": torch.tensor(True)}, [np.bool_(False)]),
        "other": object(),
    }
    assert json.loads(json.dumps(json_safe(value), allow_nan=False)) == {
        "zero_dim": 2.5,
        "grad": 3.0,
        "small": [1.0, "nan"],
        "large": "tensor float32[3, 4, 5]",
        "np_scalar": 0.5,
        "np_int": 7,
        "np_inf": "inf",
        "np_array": [[1, 2]],
        "big_array": "array float16[100]",
        "nested": [{"t": True}, [False]],
        "other": "<object>",
    }

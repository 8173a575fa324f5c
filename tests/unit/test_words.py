"""The words for an op's part in a failure: the bisect report and the TUI say the same thing."""

from __future__ import annotations

from replay.cli.render import render_verdict
from replay.reports import BisectReport, TraceVerdict
from replay.words import cause_text, op_role, role_text

ENTROPY_JSON = {
    "kind": "nonfinite",
    "cause": "op",
    "op_index": 4,
    "op": "aten::log",
    "phase": "forward",
    "made": "-inf",
    "made_from": "finite",
    "nan_from_inf": {"op_index": 5, "op": "aten::mul", "phase": "forward", "from": "-inf"},
}
DATA_JSON = {
    "kind": "nonfinite",
    "cause": "data",
    "op_index": 0,
    "op": "aten::addmm",
    "phase": "forward",
    "data": {
        "tensors": [
            {
                "name": "batch[0]",
                "path": "0",
                "shape": [8, 6],
                "dtype": "float32",
                "nan": 1,
                "posinf": 0,
                "neginf": 0,
                "count": 1,
                "positions": [[5, 3]],
            }
        ],
        "sample_axes": [0],
    },
}

ENTROPY = TraceVerdict.from_json(ENTROPY_JSON)
DATA = TraceVerdict.from_json(DATA_JSON)


def test_roles_of_the_culprit_the_converter_and_the_rest():
    assert op_role(ENTROPY, 4, "producer") == (
        "culprit",
        "the producer: made -inf from finite inputs",
    )
    word, why = op_role(ENTROPY, 5, "propagator")
    assert word == "propagator" and "turned the -inf of op 4 (aten::log) into NaN" in why
    assert op_role(ENTROPY, 9, "propagator")[0] == "propagator"
    assert op_role(ENTROPY, 1, "exempt")[0] == "exempt"
    assert role_text(ENTROPY, 3, "finite") == "finite"
    assert op_role(DATA, 0, "propagator")[0] == "data"
    assert "aten::mul turned its -inf into NaN" in cause_text(ENTROPY)
    assert cause_text(TraceVerdict()) is None


def report(extra: dict) -> str:
    d = {
        "healthy": False,
        "window": [0, 9],
        "first_bad_step": 7,
        "symptom_step": 7,
        "kind": "nonfinite",
        "criterion": "NaN/Inf",
        "reproducible": True,
        "deterministic": True,
        "replayed_steps": 3,
        "rechecked_steps": 1,
        "snapshot": 5,
        "device": "cpu",
        "samples": None,
        **extra,
    }
    return render_verdict(BisectReport.from_json(d))


def test_the_report_uses_the_same_words():
    text = report({**DATA_JSON, "samples": [5], "sample_axes": [0]})
    assert "cause         data: the input batch is non-finite: it is a data bug" in text
    assert "batch[0] float32[8, 6]: 1 NaN at [5, 3]" in text
    assert "op            aten::addmm (forward)  [data]" in text
    text = report(ENTROPY_JSON)
    assert "op            aten::log (forward)  [culprit]" in text
    assert "cause         op: aten::log made -inf from finite inputs; aten::mul turned" in text
    assert "[propagator · turned the -inf of op 4 (aten::log) into NaN]" in text
    assert "NaN from      aten::mul (forward)" in text
    text = report({**ENTROPY_JSON, "samples": [[2, 5]], "sample_axes": [0, 1]})
    assert "samples       [micro-batch, row] along dims 0, 1: [2, 5]" in text
    assert "along dim 1: 7" in report({**ENTROPY_JSON, "samples": [7], "sample_axes": [1]})

"""The op rules (replay/trace/rules.py): what is special about an op is registered by name, the
tracer's mode acts on it without being edited, and an op is registered once."""

from __future__ import annotations

import pytest
import torch

from replay.trace import rules
from replay.trace.mode import Tracer
from replay.trace.rules import OpRule, register, rule


def test_an_op_is_registered_once():
    assert rule("aten::t").alias and rule("aten::empty_like").alloc
    with pytest.raises(RuntimeError, match="aten::t is already registered"):
        register(["aten::t"], OpRule(alias=True))


def test_a_whole_namespace_takes_one_rule_and_an_unknown_op_the_plain_one():
    assert rule("profiler::_record_function_enter_new").skip
    assert rule("aten::mul") == OpRule()


def test_a_rule_registered_outside_the_mode_is_what_the_tracer_does(monkeypatch):
    net = torch.nn.Linear(2, 1)
    x = torch.tensor([float("nan"), 1.0])

    def traced() -> list[str]:
        with Tracer(net, None, {}, {}) as tr:
            torch.isnan(x).any()
        return [n.what for n in tr.findings.noticed]

    assert traced() == []  # isnan reads its input on the device, not into Python
    monkeypatch.setitem(rules._RULES, "aten::isnan", OpRule(reads="tested with isnan"))
    assert traced() == ["tested with isnan"]

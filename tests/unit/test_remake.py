"""Making a changed step function again from its record (replay/capture/remake.py): a crafted
record names no code outside the program's own file, and cells are data, never code."""

from __future__ import annotations

import types
from shutil import rmtree  # noqa: F401 - a function of another file, reachable by name here

import torch

from replay.capture.remake import remake, remake_spec


def _phase(layer, scale):
    def step(x):
        return layer(x).sum() * scale

    return step


def _other(x):
    return x


def test_a_closure_over_a_layer_and_a_tensor_is_made_again_from_the_first():
    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.Linear(2, 1))
    named = {"model": model}
    first, later = _phase(model[0], 1.0), _phase(model[1], torch.tensor(3.0))
    spec = remake_spec(first, later, named)
    assert spec is not None and spec["cells"]["layer"] == {"object": "model.1"}
    made = remake(first, spec, named)
    x = torch.ones(4, 2)
    assert torch.equal(made(x), later(x)) and made.__code__ is first.__code__


def test_a_crafted_record_names_no_function_outside_the_programs_file():
    first = _phase(torch.nn.Linear(2, 1), 1.0)
    assert remake(first, {"function": "_other"}, {}) is _other  # this file's own
    # shutil.rmtree is reachable from this module by name, but is not of its file
    assert remake(first, {"function": "rmtree"}, {}) is None
    assert remake(first, {"function": "os.system"}, {}) is None
    assert remake(first, {"function": "torch"}, {}) is None  # a module, not a function
    assert remake(first, {"cells": {"nope": {"value": 1}}}, {}) is None  # no such cell
    assert remake(first, {"cells": {"layer": {"object": "missing"}}}, {}) is None
    made = remake(first, {"cells": {"scale": {"value": 2.0}}}, {})
    assert isinstance(made, types.FunctionType) and made.__code__ is first.__code__


def test_what_cannot_be_made_again_is_not_described():
    model = torch.nn.Linear(2, 1)
    first = _phase(model, 1.0)
    assert remake_spec(first, _phase(model, object()), {"model": model}) is None  # not data
    assert remake_spec(first, lambda x: x, {"model": model}) is None  # a lambda: no name

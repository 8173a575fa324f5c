"""What the tracer treats specially in an op, by the op's name: a registry of rules.

An op is interesting to the tracer for what its schema says (the arguments it writes to: an
in-place op's values before it ran are its inputs' ``pre_bad`` state, ``Tracer.on_op``) and for
what is registered here: adding an op to a rule is a ``register`` call, never an edit of the
dispatch mode (torch's ``flop_counter`` keeps its formulas the same way). A name is registered
once; a second registration is refused, as flop_counter refuses one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._ops import OpOverload

from replay.trace.source import Interner

__all__ = ["OpRule", "OpInfo", "register", "rule", "op_info", "ALLOC_OPS"]


@dataclass(frozen=True, slots=True)
class OpRule:
    #: its output holds exactly the values of its first input, in another shape or order (the
    #: same multiset when the sizes agree): the statistics of one are those of the other
    alias: bool = False
    #: an uninitialised allocation: whatever bits it holds are never blamed (origins.py, rule 1)
    alloc: bool = False
    #: its first input's value is read into Python: the step looked at it (``Noticed``)
    reads: str = ""
    #: not an op of the step (a profiler marker): passed through, no row
    skip: bool = False


_PLAIN = OpRule()
_RULES: dict[str, OpRule] = {}


def register(names: list[str], r: OpRule) -> None:
    """Give ``r`` to the ops ``names`` (``aten::t``; ``profiler::`` for a whole namespace)."""
    for name in names:
        if name in _RULES:
            raise RuntimeError(f"an op rule for {name} is already registered")
        _RULES[name] = r


def rule(name: str) -> OpRule:
    """The rule registered for the op ``name`` (``aten::t``), else the plain one."""
    r = _RULES.get(name)
    return r if r is not None else _RULES.get(name.partition("::")[0] + "::", _PLAIN)


def _aten(*names: str) -> list[str]:
    return [f"aten::{n}" for n in names]


register(
    _aten(
        "t", "transpose", "permute", "view", "_unsafe_view", "reshape", "_reshape_alias",
        "detach", "alias", "squeeze", "unsqueeze", "flatten", "unflatten", "numpy_T", "mT",
        "matrix_H", "view_as", "reshape_as", "movedim", "swapaxes", "swapdims", "lift_fresh",
    ),
    OpRule(alias=True),
)  # fmt: skip
register(
    _aten(
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_",
        "resize_as_", "set_", "empty_permuted",
    ),
    OpRule(alloc=True),
)  # fmt: skip
register(
    ["aten::_local_scalar_dense"], OpRule(reads="a Python number read off it (.item(), float())")
)
register(["profiler::"], OpRule(skip=True))  # record_function markers
#: The names of the ``alloc`` ops registered here (for a probe that looks ops up by name).
ALLOC_OPS = frozenset(n for n, r in _RULES.items() if r.alloc)


@dataclass(slots=True)
class OpInfo:
    """One op overload as the tracer uses it: its name (``index``: in the trace's op table),
    the arguments it writes to (from its schema) and its rule."""

    name: str
    index: int
    mutated: tuple[int, ...]  # positions of arguments the op writes to
    mutated_kw: tuple[str, ...]
    rule: OpRule


def op_info(func: OpOverload[..., object], names: Interner) -> OpInfo:
    """``func``'s ``OpInfo``, its name numbered in ``names`` (a skipped op's is not)."""
    schema: torch._C.FunctionSchema = func._schema
    name = schema.name if "::" in schema.name else f"aten::{schema.name}"
    args = schema.arguments
    written = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    pos = tuple(i for i in written if not args[i].kwarg_only)
    kw = tuple(args[i].name for i in written if args[i].kwarg_only)
    r = rule(name)
    return OpInfo(name, -1 if r.skip else names(name), pos, kw, r)

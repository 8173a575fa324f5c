"""A small, safe expression language over recorded health metrics: ``--until`` and ``--spike``.

    loss > 4 * median_loss
    grad_norm > 10 * mean_grad_norm and step > 100
    not isfinite(loss) or lr > 0.1

Grammar (parsed with :mod:`ast`, evaluated by a tiny interpreter; nothing is ever ``eval``-ed):

- names: a health column (``loss``, ``grad_norm``, ``lr``, ... and ``step``) is its value at the step
  being tested; ``median_X``, ``mean_X``, ``min_X``, ``max_X``, ``std_X`` aggregate column ``X``
  over the finite values of every *earlier* step; ``prev_X`` is ``X`` at the previous step;
  ``nan``, ``inf``;
- numbers; ``+ - * /``, unary ``-``; comparisons (chains allowed); ``and``, ``or``, ``not``;
  parentheses; the functions ``abs``, ``isfinite``, ``isnan``.

Arithmetic is IEEE: ``x / 0`` is ``inf`` (``nan`` for ``0 / 0``), comparisons with NaN are false,
so an aggregate over no earlier steps (NaN) never triggers.
"""

from __future__ import annotations

import ast
import heapq
import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..store.layout import OBJECT_METRICS

__all__ = ["Expression", "PredicateError", "History", "AGGREGATES", "object_columns_in"]

AGGREGATES = ("median", "mean", "min", "max", "std", "prev")
_MAX_LEN = 500
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def object_columns_in(text: str) -> list[str]:
    """The watched objects' health columns an expression names (``netG__grad_norm``, also as
    ``median_netG__grad_norm``): which objects a recording watches is known only once it is
    open, and an expression is checked before (a column the file lacks reads as NaN)."""
    found: list[str] = []
    for name in _IDENT.findall(text[:_MAX_LEN]):
        fn, _, rest = name.partition("_")
        for col in (rest, name) if fn in AGGREGATES else (name,):
            obj, sep, metric = col.rpartition("__")
            if sep and obj and metric in OBJECT_METRICS:
                if col not in found:
                    found.append(col)
                break
    return found


_FUNCS: dict[str, Callable[[float], float]] = {
    "abs": abs,
    "isfinite": lambda x: float(math.isfinite(x)),
    "isnan": lambda x: float(math.isnan(x)),
}
_CONSTS = {"nan": math.nan, "inf": math.inf}


class PredicateError(ValueError):
    """The expression is not in the language; the message says what is allowed."""


def _div(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _guard(fn: Callable[[float, float], float]) -> Callable[[float, float], float]:
    def op(a: float, b: float) -> float:
        try:
            return fn(a, b)
        except OverflowError:
            return math.inf

    return op


_BINOPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: _guard(operator.add),
    ast.Sub: _guard(operator.sub),
    ast.Mult: _guard(operator.mul),
    ast.Div: _div,
}
_CMPOPS: dict[type, Callable[[float, float], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
# The nodes allowed as they are: the operators above and the ones that only join them.
_PLAIN = (ast.BoolOp, ast.And, ast.Or, ast.Load, *_BINOPS, *_CMPOPS, ast.USub, ast.UAdd, ast.Not)


@dataclass(frozen=True)
class _Agg:
    fn: str
    column: str


class Expression:
    """A validated expression. ``Expression.parse("loss > 4 * median_loss", columns)``."""

    def __init__(self, text: str, tree: ast.expr, columns: frozenset[str], aggs: frozenset[_Agg]):
        self.text = text
        self._tree = tree
        self.columns = columns  # plain column names used
        self.aggregates = aggs  # (fn, column) pairs used

    @classmethod
    def parse(cls, text: str, columns: Iterable[str]) -> Expression:
        known = set(columns) | {"step"}
        if len(text) > _MAX_LEN:
            raise PredicateError(f"expression longer than {_MAX_LEN} characters")
        try:
            tree = ast.parse(text.strip(), mode="eval").body
        except SyntaxError as e:
            raise PredicateError(f"{text!r} is not an expression ({e.msg})") from None
        used: set[str] = set()
        aggs: set[_Agg] = set()

        def name_ok(n: str) -> None:
            fn, _, col = n.partition("_")
            if n in known:
                used.add(n)
            elif fn in AGGREGATES and col in known and col != "step":
                aggs.add(_Agg(fn, col))
            elif n not in _CONSTS:
                raise PredicateError(
                    f"unknown name {n!r}; use a health column ({', '.join(sorted(known))}), "
                    f"an aggregate {'/'.join(AGGREGATES)}_COLUMN (e.g. median_loss), nan or inf"
                )

        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                if id(node) not in called:  # a called name is checked against _FUNCS below
                    name_ok(node.id)
            elif isinstance(node, ast.Constant):
                if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                    raise PredicateError(
                        f"only numbers are allowed as literals, not {node.value!r}"
                    )
            elif isinstance(node, ast.Call):
                if (
                    not isinstance(node.func, ast.Name)
                    or node.func.id not in _FUNCS
                    or len(node.args) != 1
                    or node.keywords
                ):
                    raise PredicateError(
                        f"only the functions {', '.join(_FUNCS)} (one argument) may be called"
                    )
            elif isinstance(node, ast.BinOp):
                if type(node.op) not in _BINOPS:
                    raise PredicateError("arithmetic is + - * / only")
            elif isinstance(node, ast.UnaryOp):
                if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
                    raise PredicateError("unary operators are - + and not")
            elif isinstance(node, ast.Compare):
                if any(type(op) not in _CMPOPS for op in node.ops):
                    raise PredicateError("comparisons are < <= > >= == !=")
            elif not isinstance(node, _PLAIN):
                raise PredicateError(f"{type(node).__name__} is not allowed in an expression")
        return cls(text.strip(), tree, frozenset(used), frozenset(aggs))

    def evaluate(self, row: dict[str, Any], history: History) -> bool:
        """Whether the expression holds for ``row``, with aggregates over ``history``."""
        return bool(self._eval(self._tree, row, history))

    def _eval(self, node: ast.expr, row: dict[str, Any], hist: History) -> float:
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, (int, float))  # parse() allows numbers only
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id in _CONSTS:
                return _CONSTS[node.id]
            if node.id in self.columns:
                v = row.get(node.id)
                return math.nan if v is None else float(v)
            fn, _, col = node.id.partition("_")
            return hist.value(_Agg(fn, col))
        if isinstance(node, ast.BinOp):
            return _BINOPS[type(node.op)](
                self._eval(node.left, row, hist), self._eval(node.right, row, hist)
            )
        if isinstance(node, ast.UnaryOp):
            v = self._eval(node.operand, row, hist)
            if isinstance(node.op, ast.Not):
                return float(not v)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, row, hist)
            for op, comp in zip(node.ops, node.comparators):
                right = self._eval(comp, row, hist)
                if not _CMPOPS[type(op)](left, right):
                    return 0.0
                left = right
            return 1.0
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return float(all(self._eval(v, row, hist) for v in node.values))
            return float(any(self._eval(v, row, hist) for v in node.values))
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)  # parse() allows calls of names only
            return float(_FUNCS[node.func.id](self._eval(node.args[0], row, hist)))
        raise PredicateError(f"{type(node).__name__} is not allowed")  # parse() refused it already

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


class _Running:
    """Running statistics of the finite values of one column: O(log n) per value."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self._low: list[float] = []  # max-heap (negated): the lower half
        self._high: list[float] = []  # min-heap: the upper half
        self.prev = math.nan

    def add(self, x: float) -> None:
        self.prev = x
        if not math.isfinite(x):
            return
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)
        self.min, self.max = min(self.min, x), max(self.max, x)
        if not self._low or x <= -self._low[0]:
            heapq.heappush(self._low, -x)
        else:
            heapq.heappush(self._high, x)
        if len(self._low) > len(self._high) + 1:
            heapq.heappush(self._high, -heapq.heappop(self._low))
        elif len(self._high) > len(self._low):
            heapq.heappush(self._low, -heapq.heappop(self._high))

    def get(self, fn: str) -> float:
        if fn == "prev":
            return self.prev
        if self.n == 0:
            return math.nan
        if fn in ("mean", "min", "max"):
            return float(getattr(self, fn))
        if fn == "std":
            return math.sqrt(self.m2 / self.n)
        if len(self._low) > len(self._high):
            return -self._low[0]
        return (-self._low[0] + self._high[0]) / 2.0


class History:
    """Aggregates of the rows seen so far (only the columns an expression needs)."""

    def __init__(self, columns: Iterable[str]) -> None:
        self._cols = {c: _Running() for c in columns}

    def add(self, row: dict[str, Any]) -> None:
        for c, r in self._cols.items():
            v = row.get(c)
            r.add(math.nan if v is None else float(v))

    def value(self, agg: _Agg) -> float:
        return self._cols[agg.column].get(agg.fn)

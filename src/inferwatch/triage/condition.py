"""Conditions: a tiny, safe expression language over the named values of a runbook (evidence values and
spec thresholds), judged in three-valued logic so that missing evidence is never mistaken for a fact.

A condition is a Python-syntax boolean expression, e.g.
``ttft_p95_seconds > ttft_target_seconds and (nodata(first_response) or first_response > 0.5)``.
Allowed: value names, numbers, ``and``/``or``/``not``, comparisons, ``+ - * /``, and the functions
``nodata(x)`` (the value is missing: the query returned nothing or failed) and ``has(x)`` (it is there).

A missing value is ``None``. Arithmetic with it gives ``None``, a comparison with it is *unknown*, and
``and``/``or``/``not`` follow Kleene's strong three-valued logic: ``False and unknown`` is False,
``True or unknown`` is True, ``not unknown`` is unknown. `judge` returns True, False or None (unknown), so a
caller can tell "the condition does not hold" from "the evidence to decide is missing" (`missing_names` says
which). Only ``nodata``/``has`` decide on absence itself. Division by zero gives ``None``.
Anything else (attribute access, calls to other functions, subscripts) is refused at parse time with
ConditionError.
"""

from __future__ import annotations

import ast
import operator
from typing import Mapping

__all__ = ["ConditionError", "compile_condition", "evaluate", "judge", "missing_names", "names_in"]


class ConditionError(ValueError):
    """A condition uses syntax outside the allowed subset, or names an unknown value."""


_COMPARE = {ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Eq: operator.eq, ast.NotEq: operator.ne}
_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_FUNCS = {"nodata": lambda v: v is None, "has": lambda v: v is not None}
_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare,
            ast.BinOp, ast.Name, ast.Load, ast.Constant, ast.Call, *_COMPARE, *_ARITH)


def compile_condition(text: str) -> ast.Expression:
    """Parse `text` into a checked AST. Raises ConditionError naming the first disallowed construct."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConditionError(f"condition {text!r} does not parse: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ConditionError(f"condition {text!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
            raise ConditionError(f"condition {text!r}: only numbers are allowed as constants")
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS and len(node.args) == 1
                    and not node.keywords and isinstance(node.args[0], ast.Name)):
                raise ConditionError(f"condition {text!r}: only nodata(name) and has(name) may be called")
    return tree


def names_in(tree: ast.Expression) -> set[str]:
    """Value names a condition reads (function names excluded)."""
    funcs = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in funcs}


def presence_only_names(tree: ast.Expression) -> set[str]:
    """Names read only through nodata()/has(): their absence is a fact the condition asks about, not
    missing evidence."""
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call)]
    skip = {id(c.args[0]) for c in calls} | {id(c.func) for c in calls}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in skip}
    return names_in(tree) - used


def judge(tree: ast.Expression, values: Mapping[str, float | None]) -> bool | None:
    """True or False when the values decide the condition, None when missing values leave it undecided.
    Unknown names → ConditionError."""
    result = _eval(tree.body, values)
    return None if result is None else bool(result)


def evaluate(tree: ast.Expression, values: Mapping[str, float | None]) -> bool:
    """True only when the condition certainly holds for `values` (unknown counts as not holding)."""
    return judge(tree, values) is True


def missing_names(tree: ast.Expression, values: Mapping[str, float | None]) -> list[str]:
    """The missing values that leave the condition undecided, left to right: only those inside a part that
    is itself undecided (in ``nodata(f) or f > 1`` a missing f decides, so it is not listed)."""
    out: list[str] = []
    for name in _missing(tree.body, values):
        if name not in out:
            out.append(name)
    return out


def _missing(node: ast.AST, values: Mapping[str, float | None]) -> list[str]:
    if _eval(node, values) is not None:
        return []
    if isinstance(node, ast.Name):
        return [node.id]
    return [name for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr)
            for name in _missing(child, values)]


def _eval(node: ast.AST, values: Mapping[str, float | None]):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise ConditionError(f"unknown evidence value {node.id!r}")
        return values[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):  # compile_condition allows no other call
        return _FUNCS[node.func.id](_eval(node.args[0], values))
    if isinstance(node, ast.BoolOp):
        results = [_truth(_eval(v, values)) for v in node.values]
        decisive = False if isinstance(node.op, ast.And) else True
        if decisive in results:
            return decisive
        return None if None in results else not decisive
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, values)
        if operand is None:
            return None
        return (not _truth(operand)) if isinstance(node.op, ast.Not) else -operand
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, values), _eval(node.right, values)
        if left is None or right is None:
            return None
        try:
            return _ARITH[type(node.op)](left, right)
        except ZeroDivisionError:
            return None
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        unknown = False
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _eval(comparator, values)
            if left is None or right is None:
                unknown = True
            elif not _COMPARE[type(op)](left, right):
                return False
            left = right
        return None if unknown else True
    raise ConditionError(f"{type(node).__name__} is not allowed")  # unreachable after compile_condition


def _truth(value) -> bool | None:
    return None if value is None else bool(value)

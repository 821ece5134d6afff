"""Finding conditions: a tiny, safe expression language over the named evidence values of a runbook.

A condition is a Python-syntax boolean expression, e.g.
``ttft_p95_seconds > 0.3 and queue_share > 0.5 and nodata(gpu_util_ratio) == False``.
Allowed: names of the page's queries, numbers, ``and``/``or``/``not``, comparisons, ``+ - * /``, and the
functions ``nodata(x)`` (the query returned nothing or failed) and ``has(x)`` (it returned a value).

A missing value is ``None``: arithmetic with it gives ``None`` and any comparison with it is false, so a
finding never fires on evidence that is not there. Division by zero also gives ``None``. Anything else
(attribute access, calls to other functions, subscripts) is refused at parse time with ConditionError.
"""

from __future__ import annotations

import ast
import operator
from typing import Mapping

__all__ = ["ConditionError", "compile_condition", "evaluate", "names_in"]


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
                    and not node.keywords):
                raise ConditionError(f"condition {text!r}: only nodata(x) and has(x) may be called")
    return tree


def names_in(tree: ast.Expression) -> set[str]:
    """Value names a condition reads (function names excluded)."""
    funcs = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in funcs}


def evaluate(tree: ast.Expression, values: Mapping[str, float | None]) -> bool:
    """True when the condition holds for `values` (name → number or None). Unknown names → ConditionError."""
    return bool(_eval(tree.body, values))


def _eval(node: ast.AST, values: Mapping[str, float | None]):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise ConditionError(f"unknown evidence value {node.id!r}")
        return values[node.id]
    if isinstance(node, ast.Call):
        return _FUNCS[node.func.id](_eval(node.args[0], values))
    if isinstance(node, ast.BoolOp):
        results = (_eval(v, values) for v in node.values)
        return all(bool(r) for r in results) if isinstance(node.op, ast.And) else any(bool(r) for r in results)
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, values)
        if isinstance(node.op, ast.Not):
            return not operand
        return None if operand is None else -operand
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
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, values)
            if left is None or right is None or not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise ConditionError(f"{type(node).__name__} is not allowed")  # unreachable after compile_condition

"""Small integer expressions over spec symbols: ``"QKV_ROWS // 16"``,
``"tokens > 2"``, ``"min(tokens, 16) * 1540"``, ``"tokens in (2, 3, 5)"``.

A spec writes sizes, task counts and conditions in the model's symbols and
build parameters; the lowering evaluates them for one build. Only arithmetic,
comparisons (chained, and ``in`` / ``not in`` a parenthesized list of values,
for rules measured case by case), ``and``/``or``/``not``,
``min``/``max``/``ceil_div`` and the names in scope are allowed: a spec is
data, never code."""

from __future__ import annotations

import ast
import operator
import warnings
from typing import Any, Mapping

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_CMPOPS = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
MAX_EXPONENT = 256
_FUNCS = {"min": min, "max": max, "ceil_div": lambda a, b: -(-a // b)}


class ExprError(ValueError):
    """An expression that does not parse, names an unknown symbol or divides by 0."""


def names(text: str | int | float | bool) -> set[str]:
    """The symbol names an expression reads (functions excluded)."""
    if not isinstance(text, str):
        return set()
    tree = _parse(text)
    return {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _FUNCS
    }


def evaluate(text: str | int | float | bool, scope: Mapping[str, Any]) -> Any:
    """The value of ``text`` with the names of ``scope``; numbers pass through."""
    if not isinstance(text, str):
        return text
    tree = _parse(text)
    try:
        value = _eval(tree.body, scope, text)
    except (ArithmeticError, TypeError, ValueError, MemoryError, RecursionError) as e:  # 10.0 ** 999, min()
        if isinstance(e, ExprError):
            raise
        raise ExprError(f"cannot evaluate {text!r}: {e}") from None
    if not isinstance(value, (int, float, bool)):  # (-1) ** 0.5 is complex
        raise ExprError(f"{text!r} is {value!r}, not a number")
    return value


def _parse(text: str) -> ast.Expression:
    try:
        with warnings.catch_warnings():  # what Python only warns about ("2and x": invalid decimal literal) is a typo here
            warnings.simplefilter("error", SyntaxWarning)
            return ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ExprError(f"cannot parse expression {text!r}: {e.msg}") from None
    except SyntaxWarning as e:
        raise ExprError(f"cannot parse expression {text!r}: {e}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, nesting too deep
        raise ExprError(f"cannot parse expression {text!r}: {e}") from None


def _eval(node: ast.AST, scope: Mapping[str, Any], text: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in scope:
            known = ", ".join(sorted(scope)) or "none"
            raise ExprError(f"unknown symbol {node.id!r} in {text!r} (known: {known})")
        return scope[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, scope, text), _eval(node.right, scope, text)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:  # 2 ** 10 ** 9 never ends
            raise ExprError(f"exponent {right} too large in {text!r} (at most {MAX_EXPONENT})")
        if isinstance(node.op, (ast.FloorDiv, ast.Mod, ast.Div)) and right == 0:
            raise ExprError(f"division by zero in {text!r}")
        value = _BINOPS[type(node.op)](left, right)
        if isinstance(value, int) and value.bit_length() > 1024:  # runaway sizes stay cheap to refuse
            raise ExprError(f"{text!r} is too large (more than 1024 bits)")
        return value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, scope, text)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _eval(node.operand, scope, text)
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, scope, text) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and _value_list(node):  # "tokens in (2, 3, 5)"
        found = _eval(node.left, scope, text) in [_eval(e, scope, text) for e in node.comparators[0].elts]
        return found == isinstance(node.ops[0], ast.In)
    if isinstance(node, ast.Compare) and all(type(op) in _CMPOPS for op in node.ops):
        left = _eval(node.left, scope, text)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, scope, text)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    ):
        return _FUNCS[node.func.id](*(_eval(a, scope, text) for a in node.args))
    raise ExprError(
        f"unsupported syntax in {text!r}: only numbers, symbols, + - * / // % **, "
        "comparisons, in / not in (a, b, ...), and/or/not, min(), max(), ceil_div() are allowed"
    )


def _value_list(node: ast.Compare) -> bool:
    """Whether ``node`` is ``x in (a, b, ...)`` or ``x not in (...)``: one membership test of a
    parenthesized list of values (a tuple literal; never a name, a range or part of a chain)."""
    return (len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and isinstance(node.comparators[0], ast.Tuple) and len(node.comparators[0].elts) > 0)

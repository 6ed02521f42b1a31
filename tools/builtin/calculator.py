"""``calculator``: arithmetic on numbers, parsed, never evaluated as code."""

from __future__ import annotations

import ast
import math
import operator

from pydantic import BaseModel, Field

from tools.base import Tool, ToolContext

__all__ = ["calculator", "evaluate"]

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorArgs(BaseModel):
    expression: str = Field(min_length=1, max_length=200, description="Arithmetic, e.g. (3 + 4) * 2 / 7 or 2 ** 10")


def evaluate(expression: str) -> float | int:
    """The value of an arithmetic expression: numbers, ``+ - * / // % **`` and
    parentheses only.

    Raises:
        ValueError: anything else (names, calls, attributes...), or a result too large.
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None

    def walk(node: ast.AST) -> float | int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 1000 or abs(left) > 1e6):
                raise ValueError("exponent too large")
            return _BINARY[type(node.op)](left, right)  # type: ignore[no-any-return]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))  # type: ignore[no-any-return]
        raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")

    try:
        value = walk(tree)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("result too large") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is not a finite number")
    if isinstance(value, int) and abs(value) > 10**100:
        raise ValueError("result too large")
    return value


async def _run(args: CalculatorArgs, context: ToolContext) -> str:  # type: ignore[override]
    value = evaluate(args.expression)
    return str(round(value, 12) if isinstance(value, float) else value)


calculator = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses).",
    args_schema=CalculatorArgs,
    run=_run,  # type: ignore[arg-type]
    timeout_s=2.0,
    idempotent=True,
    examples=('User: What is 17 * 23? -> calculator({"expression": "17 * 23"})',),
)
